from datetime import UTC, datetime

import orjson

from bson.int64 import Int64

from chat.messages import Message, encode_doc, from_doc, inserted_docs, rfc3339

NS = "chat.messages"


def test_frame_is_the_public_shape():
    m = Message(42, "alice", "bob", "hi <b>é😀", datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC), "c1")
    assert orjson.loads(m.frame()) == {
        "type": "message", "id": "42", "from": "alice", "to": "bob", "body": "hi <b>é😀",
        "created_at": "2026-01-02T03:04:05.678Z", "client_msg_id": "c1"}


def test_doc_round_trip():
    m = Message(7, "a", "b", "x", datetime(2026, 1, 1, tzinfo=UTC))
    assert from_doc(m.to_doc()) == m


def test_the_daemons_one_step_encoding_is_byte_for_byte_the_frame():
    aware = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    for doc in ({"_id": 42, "from": "alice", "to": "bob", "body": "hi <b>\u00e9\U0001f600\x00", "created_at": aware,
                 "client_msg_id": "c1"},
                {"_id": Int64(7), "from": "a", "to": "b", "body": "x", "created_at": aware.replace(tzinfo=None)},
                {"_id": 8, "from": "a", "to": "a", "body": "\u202e", "created_at": aware, "client_msg_id": None}):
        m = from_doc(doc)
        assert encode_doc(doc) == (m.id, m.sender, m.recipient, m.created_at, m.frame())
        assert type(encode_doc(doc)[0]) is int and encode_doc(doc)[3].tzinfo is UTC


def test_naive_datetimes_are_utc():
    assert rfc3339(datetime(2026, 1, 1)) == "2026-01-01T00:00:00.000Z"


def test_only_inserts_into_the_messages_namespace_count():
    doc = {"_id": 1}
    assert inserted_docs({"op": "i", "ns": NS, "o": doc}, NS) == [doc]
    assert inserted_docs({"op": "i", "ns": "chat.meta", "o": doc}, NS) == []
    assert inserted_docs({"op": "d", "ns": NS, "o": doc}, NS) == []  # sweeper / TTL deletes
    assert inserted_docs({"op": "u", "ns": NS, "o": doc}, NS) == []
    assert inserted_docs({"op": "n", "ns": "", "o": {}}, NS) == []


def test_inserts_inside_a_transaction_count_too():
    entry = {"op": "c", "ns": "admin.$cmd", "o": {"applyOps": [
        {"op": "i", "ns": NS, "o": {"_id": 1}},
        {"op": "i", "ns": "other.coll", "o": {"_id": 2}},
        {"op": "d", "ns": NS, "o": {"_id": 3}},
        {"op": "i", "ns": NS, "o": {"_id": 4}},
    ]}}
    assert inserted_docs(entry, NS) == [{"_id": 1}, {"_id": 4}]
