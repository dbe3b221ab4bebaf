"""What the relay puts on its socket of each oplog entry: only what a daemon reads."""

import datetime

import bson
from bson import ObjectId, Timestamp

from chat.messages import inserted_docs
from relay.protocol import frame, slim


def test_an_entry_goes_to_the_daemons_with_op_ns_o_and_ts_only():
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    doc = {"_id": 7, "from": "a", "to": "b", "body": "hi", "client_msg_id": None, "created_at": when}
    entry = {"_id": ObjectId(), "op": "i", "ns": "chat.messages", "o": doc, "ts": Timestamp(5, 1), "t": 1, "v": 2,
             "wall": when}
    got = bson.decode(frame({"b": [slim(entry)]}))["b"][0]
    assert set(got) == {"op", "ns", "o", "ts"}
    assert got["ts"] == Timestamp(5, 1)
    # decoded without tz_aware, as bson.decode does by default: the same document, naive UTC
    assert inserted_docs(got, "chat.messages") == [{**doc, "created_at": when.replace(tzinfo=None)}]


def test_a_transactions_entry_keeps_its_inner_entries_whole():
    inner = {"op": "i", "ns": "chat.messages", "o": {"_id": 1}, "ui": "x"}
    entry = {"op": "c", "ns": "admin.$cmd", "o": {"applyOps": [inner]}, "ts": Timestamp(6, 1), "wall": None}
    assert slim(entry) == {"op": "c", "ns": "admin.$cmd", "o": {"applyOps": [inner]}, "ts": Timestamp(6, 1)}
    assert inserted_docs(slim(entry), "chat.messages") == [{"_id": 1}]
