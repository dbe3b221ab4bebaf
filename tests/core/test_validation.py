import pytest

from api.errors import ApiError
from api.validation import parse_history_query, parse_message


def parse(raw: bytes):
    return parse_message(raw, "alice", 4000)


def err(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(raw)
    return info.value


def test_valid_message():
    d = parse(b'{"to": "bob", "body": "hi", "client_msg_id": "c-1"}')
    assert (d.sender, d.recipient, d.body, d.client_msg_id) == ("alice", "bob", "hi", "c-1")


@pytest.mark.parametrize("raw", [
    b"{", b"not json", b'{"to": "bob", "body": NaN}', b'{"to": "bob", "body": Infinity}',
    b'{"to": "bob", "to": "eve", "body": "x"}', b'{"to": "bob", "body": "\xff\xfe"}',
    b'{"to": "bob", "body": "\\ud800"}', b'{"to": "bob", "body": "x", "z": ' + b"[" * 40 + b"]" * 40 + b"}",
    b"",
])
def test_malformed_json_is_400(raw):
    assert err(raw).status == 400


@pytest.mark.parametrize("raw,field", [
    (b'{"body": "x"}', "to"),
    (b'{"to": "bad user", "body": "x"}', "to"),
    (b'{"to": {"$ne": ""}, "body": "x"}', "to"),
    (b'{"to": "bob"}', "body"),
    (b'{"to": "bob", "body": ""}', "body"),
    (b'{"to": "bob", "body": 5}', "body"),
    (b'{"to": "bob", "body": {"$ne": ""}}', "body"),
    (b'{"to": "bob", "body": "' + b"x" * 4001 + b'"}', "body"),
    (b'{"to": "bob", "body": "x", "from": "eve"}', "from"),
    (b'{"to": "bob", "body": "x", "client_msg_id": 3}', "client_msg_id"),
    (b'{"to": "bob", "body": "x", "client_msg_id": "has space"}', "client_msg_id"),
])
def test_wrong_shape_is_422_naming_the_field(raw, field):
    e = err(raw)
    assert (e.status, e.field) == (422, field)


def test_non_object_is_422():
    assert err(b"[1, 2]").status == 422


def test_body_limit_counts_characters_not_bytes():
    assert parse(('{"to": "b", "body": "' + "😀" * 4000 + '"}').encode()).body == "😀" * 4000


def test_history_query():
    assert parse_history_query({"with": "bob"}) == ("bob", None, 50)
    assert parse_history_query({"with": "bob", "before": "10", "limit": "5"}) == ("bob", 10, 5)
    for bad in ({"with": "bad user"}, {"with": "bob", "limit": "0"}, {"with": "bob", "limit": "201"},
                {"with": "bob", "before": "-1"}, {"with": "bob", "x": "1"}, {},
                {"with": "bob", "before": "²"}, {"with": "bob", "limit": "٣"}, {"with": "bob", "before": "1" * 5000}):
        with pytest.raises(ApiError) as info:
            parse_history_query(bad)
        assert info.value.status == 422
