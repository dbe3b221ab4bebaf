"""Every bad input gets a clear JSON error naming the field, and nothing is written."""

import asyncio
import socket
import time

import httpx
import jwt
import pytest

from tests.e2e.helpers import mongo_docs, mongo_docs_soon, mysql_rows, post
from tests.timing import PATIENCE

GOOD = b'{"to": "bob", "body": "x"}'


def raw_post(system, body: bytes, token: str | None, **headers) -> httpx.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    headers.setdefault("Content-Type", "application/json")
    return httpx.post(f"{system.api_url}/v1/messages", content=body, headers=headers, timeout=PATIENCE)


def nothing_stored(system, sender):
    return not mysql_rows(system, "sender = :s", s=sender) and not mongo_docs(system, {"from": sender})


def forged(system, sender):
    return {
        "bad signature": jwt.encode({"sub": sender, "exp": int(time.time()) + 60}, "wrong" * 8, algorithm="HS256"),
        "expired": jwt.encode({"sub": sender, "exp": int(time.time()) - 5}, system.secret, algorithm="HS256"),
        "alg none": jwt.encode({"sub": sender, "exp": int(time.time()) + 60}, None, algorithm="none"),
        "no exp": jwt.encode({"sub": sender}, system.secret, algorithm="HS256"),
        "garbage": "not.a.jwt",
    }


def test_unauthorised_requests_get_401_and_store_nothing(system, users):
    sender = users("mallory")
    r = raw_post(system, GOOD, None)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    for name, token in forged(system, sender).items():
        r = raw_post(system, GOOD, token)
        assert r.status_code == 401, name
        assert r.json()["error"] == "unauthorized", name
    assert nothing_stored(system, sender)


BAD_SHAPE = [
    (b'{"body": "x"}', "to"),
    (b'{"to": "not a user!", "body": "x"}', "to"),
    (b'{"to": {"$ne": ""}, "body": "x"}', "to"),
    (b'{"to": "bob", "body": ""}', "body"),
    (b'{"to": "bob", "body": 42}', "body"),
    (b'{"to": "bob", "body": {"$ne": ""}}', "body"),
    (b'{"to": "bob", "body": "' + b"y" * 4001 + b'"}', "body"),
    (b'{"to": "bob", "body": "x", "from": "admin"}', "from"),
    (b'{"to": "bob", "body": "x", "client_msg_id": ["a"]}', "client_msg_id"),
]


@pytest.mark.parametrize("body,field", BAD_SHAPE)
def test_wrong_shape_gets_422_naming_the_field(system, users, body, field):
    sender = users("s")
    r = raw_post(system, body, system.token(sender))
    assert r.status_code == 422
    assert r.json()["field"] == field and field in r.json()["message"]
    assert nothing_stored(system, sender)


MALFORMED = [b"{", b'{"to": "bob", "body": NaN}', b'{"to": "bob", "to": "eve", "body": "x"}',
             b'{"to": "bob", "body": "\\udc00"}', b'{"to": "bob", "body": "\xc3\x28"}',
             b"[" * 5000 + b"]" * 5000, b'{"to": "bob", "body": "x", "a": ' + b"[" * 20 + b"]" * 20 + b"}"]


@pytest.mark.parametrize("body", MALFORMED)
def test_malformed_json_gets_400(system, users, body):
    sender = users("s")
    r = raw_post(system, body, system.token(sender))
    assert r.status_code == 400 and r.json()["error"] == "malformed_json"
    assert nothing_stored(system, sender)


def test_body_over_16_kib_gets_413_without_reading_it(system, users):
    sender = users("s")
    big = b'{"to": "bob", "body": "' + b"z" * (16 * 1024) + b'"}'
    r = raw_post(system, big, system.token(sender))
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"

    def chunks():  # no Content-Length: the limit applies while streaming
        yield b'{"to": "bob", "body": "'
        for _ in range(64):
            yield b"z" * 1024
        yield b'"}'

    r = httpx.post(f"{system.api_url}/v1/messages", content=chunks(),
                   headers={"Authorization": f"Bearer {system.token(sender)}"}, timeout=PATIENCE)
    assert r.status_code == 413
    assert nothing_stored(system, sender)


def _answer_then_close(system, head: bytes) -> tuple[bytes, float]:
    """Sends a request head that never ends; returns all the API answers before it closes."""
    host, port = system.api_url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=PATIENCE) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data, time.monotonic() - started


def test_an_oversized_or_trickled_request_head_is_refused_and_closed(system):
    # The shared system's API has CHAT_API_HEAD_TIMEOUT_SECONDS=2 (default 10).
    data, _ = _answer_then_close(system, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 40_000)
    assert data.startswith(b"HTTP/1.1 431 ") and b'"error":"headers_too_large"' in data
    data, took = _answer_then_close(system, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # no blank line: unfinished
    assert data.startswith(b"HTTP/1.1 408 ") and b'"error":"request_timeout"' in data
    assert 1.5 < took < 8
    assert httpx.get(f"{system.api_url}/healthz").status_code == 200  # the others are served as before


@pytest.mark.parametrize("body", [
    "<script>alert(1)</script> & <img src=x onerror=alert(1)>",
    "'; DROP TABLE messages; -- \" OR 1=1",
    "emoji 😀👩‍👩‍👧 and flags 🇫🇷, zero-width \u200d joiner",
    "مرحبا بالعالم \u202e RTL override שלום",
    "tab\tnewline\nnull-ish \\u0000 backslash \\",
    "a real NUL \x00 and C1 \x85 controls \x1b[31m",
])
async def test_hostile_and_unicode_text_is_stored_and_returned_byte_for_byte(system, users, body):
    alice, bob = users("alice"), users("bob")
    r = await post(system, alice, bob, body)
    assert r.status_code == 201 and r.json()["body"] == body
    [row] = mysql_rows(system, "sender = :s", s=alice)
    assert row.body.encode() == body.encode()
    [doc] = await mongo_docs_soon(system, {"from": alice}, 1)
    assert doc["body"] == body
    history = httpx.get(f"{system.api_url}/v1/messages", params={"with": alice},
                        headers={"Authorization": f"Bearer {system.token(bob)}"}).json()
    assert [m["body"] for m in history["messages"]] == [body]


@pytest.mark.parametrize("partition", ["0", "7", "-1", "not a number", "9" * 40])
def test_a_post_s_partition_is_the_proxy_s_route_and_the_api_ignores_it(system, users, partition):
    """A client sends its ?partition= on POST /v1/messages for the proxy to route on; a stale,
    wrong or hostile one changes nothing: the message is stored in its sender's partition."""
    alice, bob = users("alice"), users("bob")
    r = httpx.post(f"{system.api_url}/v1/messages", params={"partition": partition},
                   json={"to": bob, "body": "routed"},
                   headers={"Authorization": f"Bearer {system.token(alice)}"}, timeout=PATIENCE)
    assert r.status_code == 201, r.text
    [row] = mysql_rows(system, "sender = :s", s=alice)
    assert (str(row.id), row.body) == (r.json()["id"], "routed")


async def test_racing_retries_store_exactly_one_message(system, users):
    alice, bob = users("alice"), users("bob")
    async with httpx.AsyncClient(timeout=PATIENCE) as c:
        replies = await asyncio.gather(*[post(system, alice, bob, "once", "retry-1", client=c) for _ in range(20)])
    assert sorted(r.status_code for r in replies) == [200] * 19 + [201]
    assert len({r.json()["id"] for r in replies}) == 1
    assert len(mysql_rows(system, "sender = :s", s=alice)) == 1
    again = await post(system, alice, bob, "once", "retry-1")
    assert again.status_code == 200 and again.json() == replies[0].json()
    # and no second copy follows: the writer mirrors in id order, so once a later
    # message is in Mongo, a second copy of this one would be there too
    assert (await post(system, alice, bob, "after the retries")).status_code == 201
    docs = await mongo_docs_soon(system, {"from": alice}, 2)
    assert [d["body"] for d in docs] == ["once", "after the retries"]


async def test_reused_client_msg_id_for_another_message_is_409(system, users):
    alice, bob = users("alice"), users("bob")
    assert (await post(system, alice, bob, "first", "k")).status_code == 201
    r = await post(system, alice, bob, "different", "k")
    assert r.status_code == 409 and r.json()["field"] == "client_msg_id"
    assert [row.body for row in mysql_rows(system, "sender = :s", s=alice)] == ["first"]


async def test_same_client_msg_id_from_another_sender_is_a_new_message(system, users):
    alice, carol, bob = users("alice"), users("carol"), users("bob")
    a = await post(system, alice, bob, "x", "same")
    c = await post(system, carol, bob, "x", "same")
    assert a.status_code == c.status_code == 201 and a.json()["id"] != c.json()["id"]


async def test_history_pages_newest_first_and_only_for_participants(system, users):
    alice, bob, eve = users("alice"), users("bob"), users("eve")
    sent = [(await post(system, alice if i % 2 else bob, bob if i % 2 else alice, f"m{i}")).json()["id"]
            for i in range(7)]
    await post(system, alice, eve, "not for bob")
    headers = {"Authorization": f"Bearer {system.token(bob)}"}
    page1 = httpx.get(f"{system.api_url}/v1/messages", params={"with": alice, "limit": 4}, headers=headers).json()
    assert [m["id"] for m in page1["messages"]] == sent[::-1][:4]
    page2 = httpx.get(f"{system.api_url}/v1/messages",
                      params={"with": alice, "limit": 4, "before": page1["next_before"]}, headers=headers).json()
    assert [m["id"] for m in page2["messages"]] == sent[::-1][4:] and page2["next_before"] is None
    # eve's conversation with alice is invisible to bob: he can only ask about his own
    theirs = httpx.get(f"{system.api_url}/v1/messages", params={"with": eve}, headers=headers).json()
    assert theirs["messages"] == []
