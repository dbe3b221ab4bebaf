from datetime import UTC, datetime
from types import SimpleNamespace

import orjson

from bson.int64 import Int64

from chat.messages import Kind, Message, encode_doc, inserted_docs, rfc3339, shown_digest, shown_digest_of
from db.partition_map import tables_of
from db.sql import MESSAGE_COLUMNS, message_row, message_values

NS = "chat.messages"


def test_the_api_answers_the_public_shape():
    m = Message(42, "alice", "bob", "hi <b>é😀", datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC), "c1")
    assert m.to_public() == {
        "type": "message", "id": "42", "from": "alice", "to": "bob", "body": "hi <b>é😀",
        "created_at": "2026-01-02T03:04:05.678Z", "client_msg_id": "c1"}


def test_a_daemons_frame_is_byte_for_byte_what_the_api_answered():
    aware = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    for m in (Message(42, "alice", "bob", "hi <b>\u00e9\U0001f600\x00", aware, "c1"),
              Message(8, "a", "a", "\u202e", aware)):
        assert encode_doc(m.to_doc()) == (m.id, m.sender, m.recipient, m.created_at, orjson.dumps(m.to_public()))


def test_what_pymongo_may_hand_back_is_encoded_the_same():
    # naive datetimes (pymongo's default, in UTC), Int64 ids, no client_msg_id at all
    m = Message(7, "a", "b", "x", datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC))
    doc = {"_id": Int64(7), "from": "a", "to": "b", "body": "x", "created_at": m.created_at.replace(tzinfo=None)}
    encoded = encode_doc(doc)
    assert encoded == (7, "a", "b", m.created_at, orjson.dumps(m.to_public()))
    assert type(encoded[0]) is int and encoded[3].tzinfo is UTC


AT = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
EVERY_SHAPE = (
    Message(1, "alice", "bob", "hi <b>é😀", AT, "c1"),
    Message(2, "alice", "bob", "no key", AT),
    Message(3, "bob", "alice", "hé!", AT, "c2", kind=Kind.EDIT, ref_id=1),
    Message(4, "bob", "alice", "", AT, "c3", kind=Kind.DELETE, ref_id=1),
    Message(5, "alice", "bob", "", AT, None, kind=Kind.READ, ref_id=3),
    Message(6, "alice", "bob", "", AT, None, kind=Kind.DELIVERED, ref_id=4),
    Message(7, "alice", "bob", "copied", AT, "c4", origin_part=2, origin_id=2**40),  # a copy names its original
    Message(8, "alice", "bob", "", AT, None, origin_part=1, origin_id=9, kind=Kind.READ, ref_id=7),
    Message(9, "alice", "bob", "second", AT, "c5", edited_at=AT.replace(second=59)),
    Message(10, "alice", "bob", "", AT, "c6", deleted=True),
)


def test_every_shape_of_row_comes_back_from_its_document():
    for m in EVERY_SHAPE:
        assert Message.from_doc(m.to_doc()) == m


def test_a_document_as_pymongo_hands_it_back_is_the_same_message():
    # naive datetimes (pymongo's default, in UTC) and Int64 numbers
    for m in EVERY_SHAPE:
        doc = {k: Int64(v) if type(v) is int else v.replace(tzinfo=None) if isinstance(v, datetime) else v
               for k, v in m.to_doc().items()}
        back = Message.from_doc(doc)
        assert back == m
        assert type(back.id) is int and back.created_at.tzinfo is UTC
        assert back.edited_at is None or back.edited_at.tzinfo is UTC


def test_the_daemons_encoding_of_a_document_is_the_frame_of_its_message():
    # encode_doc reads the document itself (the hot path): it must frame each shape as Message does
    for m in EVERY_SHAPE:
        assert encode_doc(m.to_doc())[4] == orjson.dumps(Message.from_doc(m.to_doc()).to_public()), m


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


def test_the_digest_covers_what_a_device_shows_and_nothing_else():
    at = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    m = Message(7, "alice", "bob", "hi é😀", at, "c1")
    same = shown_digest(m.to_doc())
    # as pymongo may hand it back: naive UTC, an Int64 id; origin fields are not shown
    assert shown_digest({**m.to_doc(), "_id": Int64(7), "created_at": at.replace(tzinfo=None)}) == same
    assert shown_digest({**m.to_doc(), "origin_part": 1, "origin_id": 3}) == same
    for changed in ({"_id": 8}, {"from": "mallory"}, {"to": "carol"}, {"body": "hi é😀 "}, {"client_msg_id": None},
                    {"client_msg_id": "c2"}, {"created_at": at.replace(microsecond=679000)}):
        assert shown_digest({**m.to_doc(), **changed}) != same, changed


def test_the_digest_keeps_fields_apart_whatever_they_contain():
    at = datetime(2026, 1, 2, tzinfo=UTC)
    a = Message(1, "a\x1fb", "c", "d", at).to_doc()
    b = Message(1, "a", "b\x1fc", "d", at).to_doc()
    c = Message(1, "a", "b", "c\x1fd", at).to_doc()
    assert len({shown_digest(a), shown_digest(b), shown_digest(c)}) == 3


def test_digests_combine_in_any_order():
    at = datetime(2026, 1, 2, tzinfo=UTC)
    docs = [Message(i, "a", "b", f"m{i}", at).to_doc() for i in range(1, 5)]
    assert shown_digest_of(docs) == shown_digest_of(docs[::-1]) != shown_digest_of(docs[:3])
    assert shown_digest_of([]) == 0


def test_a_message_row_is_every_partitions_columns_in_order_and_reads_back_as_the_message():
    for partition in (0, 1, 7):
        assert MESSAGE_COLUMNS == tuple(c.name for c in tables_of(partition).messages.columns)
    at = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    m = Message(9, "bob", "alice", "hi", at, "c9", origin_part=2, origin_id=5, kind=Kind.EDIT, ref_id=3,
                edited_at=at, deleted=False)
    assert len(message_values(m)) == len(MESSAGE_COLUMNS)
    row = message_row(m)
    assert row["conversation"] == "alice\x00bob" and row["created_at"].tzinfo is None
    assert Message.from_row(SimpleNamespace(**row)) == m
