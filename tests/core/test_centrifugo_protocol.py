"""Centrifugo's side of the peers benchmark, without a server: the token, the
client's connect command, the parse of server frames in the shapes v5.4.9
sends, the config keys and the batch API's body and reply."""

import time

import jwt
import orjson
import pytest

from loadtest.clients import centrifugo

SECRET = "peer-secret-" + "0" * 32


def test_token_is_hs256_with_sub_and_exp():
    before = int(time.time())
    claims = jwt.decode(centrifugo.token(SECRET, "u1", ttl_seconds=600), SECRET, algorithms=["HS256"])
    assert claims["sub"] == "u1"
    assert before + 600 <= claims["exp"] <= int(time.time()) + 600
    assert jwt.get_unverified_header(centrifugo.token(SECRET, "u1"))["alg"] == "HS256"
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(centrifugo.token(SECRET, "u1"), "x" * 44, algorithms=["HS256"])


def test_connect_command_bytes():
    assert centrifugo.connect_command("abc.def.ghi") == b'{"id":1,"connect":{"token":"abc.def.ghi"}}'


def test_personal_channel():
    assert centrifugo.personal_channel("u1") == "#u1"


def test_several_publications_in_one_frame():
    frame = (b'{"push":{"channel":"#u1","pub":{"data":{"id":1,"t":1.5}}}}\n'
             b'{"push":{"channel":"#u1","pub":{"data":{"id":2,"t":1.6},"offset":0}}}\n'
             b'{"push":{"channel":"#u1","pub":{"data":"plain"}}}')
    pubs, ping = centrifugo.publications(frame)
    assert pubs == [{"id": 1, "t": 1.5}, {"id": 2, "t": 1.6}, "plain"]
    assert ping is False
    assert centrifugo.connect_reply_ok(frame) is None


def test_ping_alone_and_among_publications():
    assert centrifugo.parse_frame(b"{}") == ([], True, None)
    pubs, ping = centrifugo.publications(b'{}\n{"push":{"channel":"#u1","pub":{"data":{"id":7}}}}\n')
    assert (pubs, ping) == ([{"id": 7}], True)


def test_connect_reply_ok_and_error():
    ok = (b'{"id":1,"connect":{"client":"c0ffee","version":"5.4.9","subs":{"#u1":{}},"ping":120,"pong":true}}\n'
          b'{"push":{"channel":"#u1","pub":{"data":{"id":3}}}}')
    assert centrifugo.parse_frame(ok) == ([{"id": 3}], False, True)
    assert centrifugo.connect_reply_ok(b'{"id":1,"error":{"code":109,"message":"token expired"}}') is False
    # A reply to some other command id is not the connect reply.
    assert centrifugo.connect_reply_ok(b'{"id":2,"connect":{}}') is None
    # Non-publication pushes (e.g. a server-side unsubscribe) carry no data.
    assert centrifugo.publications(b'{"push":{"channel":"#u1","unsubscribe":{"code":2000}}}') == ([], False)


def test_config_keys():
    conf = centrifugo.config(8123, SECRET, "k1")
    assert conf == {
        "address": "127.0.0.1", "port": "8123", "engine": "memory", "token_hmac_secret_key": SECRET,
        "api_key": "k1", "user_subscribe_to_personal": True, "ping_interval": "120s", "pong_timeout": "8s",
        "log_level": "error", "health": True, "usage_stats_disable": True,
    }
    # Centrifugo exits at start unless the ping interval exceeds the pong timeout.
    assert centrifugo.config(1, "s", "k", ping_seconds=30)["ping_interval"] == "30s"
    assert orjson.loads(orjson.dumps(conf)) == conf


def test_batch_body():
    body = centrifugo.batch_body([("#u1", {"id": 1}), ("#u2", {"id": 2})])
    assert body == (b'{"commands":[{"publish":{"channel":"#u1","data":{"id":1}}},'
                    b'{"publish":{"channel":"#u2","data":{"id":2}}}]}')
    assert orjson.loads(centrifugo.batch_body([("#u1", 1)], parallel=True))["parallel"] is True


def test_batch_errors():
    assert centrifugo.batch_errors(b'{"replies":[{"publish":{}},{"publish":{}}]}', 2) == 0
    assert centrifugo.batch_errors(b'{"replies":[{"publish":{}},{"error":{"code":102,"message":"unknown channel"}}]}',
                                   2) == 1
    assert centrifugo.batch_errors(b'{"replies":[{"publish":{}}]}', 3) == 3  # replies missing
    assert centrifugo.batch_errors(b"not json", 4) == 4
    assert centrifugo.batch_errors(b"[]", 1) == 1
