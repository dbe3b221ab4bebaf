"""The daemon's partition decisions, pure: whom it serves (else 421), where a
``since`` resumes, the cursor a frame carries, how a shared oplog batch is
split by partition, and that a hub only reaches its partition's users."""

import bson
import orjson
from bson import Timestamp

from chat.messages import Message, encode_doc, now_ms
from chat.partitions import Cursor, SlotMap, slot_of
from daemon.hub import Hub, Hubs, Subscriber
from daemon.partitioning import cursor_text, frame_encoder, resume_since, with_cursor, wrong_partition
from oplog.fanout import start_point
from oplog.namespaces import partition_namespaces, split_by_namespace
from relay.routing import part_of
from relay.server import Downstream

TWO = SlotMap.even(2)


def user_in(partition: int, slot_map: SlotMap = TWO) -> str:
    return next(u for i in range(10_000) if slot_map.partition_of(u := f"user{i}") == partition)


def test_a_served_user_passes_and_any_other_gets_421_with_its_own_partition():
    assert wrong_partition(1, frozenset({1}), None) is None
    assert wrong_partition(1, frozenset({0, 1}), "1") is None
    for served, asked in ((frozenset({0}), None), (frozenset({0}), "1"), (frozenset({0, 1}), "0"),
                          (frozenset({1}), "x"), (frozenset({1}), "01x"), (frozenset({1}), "")):
        refused = wrong_partition(1, served, asked)
        assert refused is not None and refused.status == 421
        assert orjson.loads(refused.body()) == {"error": "wrong_partition", "partition": 1,
                                                "message": "this user is served by the daemons of partition 1"}


def test_since_resumes_only_in_the_users_partition_and_epoch():
    one = SlotMap.even(1)
    assert [resume_since(raw, "anyone", one) for raw in (None, "", "12", "0.0.12", "x", "1.0.12")] == [
        None, None, 12, 12, None, None]
    assert resume_since(str(2**63), "anyone", one) is None  # past BSON's integers: unknown
    ann = user_in(1)
    assert resume_since("1.0.7", ann, TWO) == 7
    assert resume_since("0.0.7", ann, TWO) is None  # made in another partition
    moved = TWO.move([slot_of(ann)], 0)
    assert resume_since("1.0.7", ann, moved) is None and resume_since("7", ann, moved) is None
    assert resume_since("0.1.7", ann, moved) == 7  # made after the move
    stayed = user_in(0)
    assert resume_since("7", stayed, moved) == 7  # a bare id is trusted while the user's slot never moved


def test_cursor_text_is_the_cursors_encoding():
    for partition, epoch, position in ((0, 0, 5), (1, 0, 5), (0, 2, 9), (3, 4, 0)):
        assert cursor_text(partition, epoch, position) == Cursor(partition, epoch, position).encode()


def test_frames_of_the_single_stream_are_unchanged_and_others_carry_their_cursor():
    doc = Message(41, "ann", "ben", "hi \"there\"", now_ms(), "c1").to_doc()
    assert frame_encoder(0, SlotMap.even(1)) is encode_doc  # byte for byte, no work added
    encoded = frame_encoder(1, TWO)(doc)
    assert encoded[:4] == encode_doc(doc)[:4]
    assert orjson.loads(encoded[4]) == {**orjson.loads(encode_doc(doc)[4]), "cursor": "1.0.41"}
    moved = SlotMap.even(1).move([3], 0)  # one partition at epoch 1: cursors say so
    assert orjson.loads(frame_encoder(0, moved)(doc)[4])["cursor"] == "0.1.41"
    assert with_cursor(b'{"a":1}', "2") == b'{"a":1,"cursor":"2"}'


def test_a_batch_is_split_by_namespace_in_order_and_a_transaction_goes_where_its_inserts_go():
    ns0, ns1 = partition_namespaces("chat", [0, 1])
    assert (ns0, ns1) == ("chat.messages", "chat.messages_p1")
    entries = [{"ns": ns0, "op": "i", "o": {"_id": 1}}, {"ns": ns1, "op": "i", "o": {"_id": 1}},
               {"ns": "chat.meta", "op": "u"}, {"ns": ns0, "op": "i", "o": {"_id": 2}},
               {"ns": "admin.$cmd", "op": "c", "o": {"applyOps": [{"ns": ns1, "op": "i", "o": {"_id": 2}}]}}]
    groups = split_by_namespace(entries, {ns0, ns1})
    assert groups == {ns0: [entries[0], entries[3]], ns1: [entries[1], entries[4]]}
    assert split_by_namespace(entries, {ns0}) == {ns0: [entries[0], entries[3]]}
    for e in entries:
        e["ts"] = None
    parts = {ns: part_of(ns, part, [bson.encode(e) for e in part]) for ns, part in groups.items()}

    def taken(wanted: frozenset[str] | None) -> list:
        data = Downstream(None, wanted, None, "test").frames(parts)  # type: ignore[arg-type]  # never written to
        return [e for f in bson.decode_all(data) for e in f["b"]]

    assert taken(frozenset({ns1})) == [entries[1], entries[4]]
    assert taken(None) == [entries[0], entries[3], entries[1], entries[4]]
    assert taken(frozenset({"chat.messages_p2"})) == []


def test_a_shared_tail_starts_at_the_oldest_start_point_of_its_streams():
    assert start_point([Timestamp(5, 1), Timestamp(4, 2)]) == Timestamp(4, 2)
    assert start_point([Timestamp(5, 1), None]) == Timestamp(0, 0)  # an empty oplog: every entry is wanted


class Recorder:
    def __init__(self, user: str, partition: int):
        self.subscriber = Subscriber(self, user, 0, partition)
        self.subscriber.pending = None  # live
        self.got: list[int] = []

    def send(self, msg_id: int, payload: bytes, frame: bytes | None) -> None:
        self.got.append(msg_id)


def test_a_partitions_hub_reaches_only_that_partitions_users():
    hubs = Hubs({0: Hub(1000), 1: Hub(1000)})
    ann, ben = Recorder("ann", 0), Recorder("ben", 1)
    for recorder in (ann, ben):
        hubs.register(recorder.subscriber)
    assert hubs.count == 2
    # The original (ann -> ben) in partition 0's stream, its copy in partition 1's.
    assert hubs.by_partition[0].dispatch(7, "ann", "ben", b"{}", lambda p: p) == 1
    assert hubs.by_partition[1].dispatch(3, "ann", "ben", b"{}", lambda p: p) == 1
    assert (ann.got, ben.got) == ([7], [3])
    hubs.unregister(ben.subscriber)
    assert hubs.count == 1 and hubs.by_partition[1].connections_of("ben") == 0

