"""The relay routed by user (relay/routing.py, relay/server.py, relay/client.py),
fed a list of oplog entries instead of a database: each daemon gets the
entries of the users it holds and of nothing else, and of every other
message document its id and digest, so that it still sees every id; the
frames it gets decode to what the relay meant; a sub is marked in the
stream where it applies; an unsub stops the user's entries; a reconnection
names the whole set of users again and the ring is cut for it."""

from __future__ import annotations

import asyncio
import struct
from datetime import UTC, datetime

import bson
from bson import Timestamp
from bson.codec_options import CodecOptions
from prometheus_client import REGISTRY

from chat.messages import shown_digest
from oplog.events import Batch, Restarted, Subscribed
from relay.client import RelayTail
from relay.protocol import HELLO_MAX, REQUEST_MAX, frame, read_frame
from relay.routing import EVERY, NONE, batch_frame, cut, key_of, part_of, passed_count, unpack_passed, whole_frame
from tests.core.test_relay import PATIENCE, START, ListSource, relay_on
from tests.timing import eventually

NS = "chat.messages"
AWARE = CodecOptions(tz_aware=True)
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def message(i: int, sender: str, recipient: str, ns: str = NS) -> dict:
    return {"op": "i", "ns": ns, "ts": Timestamp(START.time + 1, i),
            "o": {"_id": i, "from": sender, "to": recipient, "body": f"m{i}", "created_at": WHEN,
                  "client_msg_id": None}}


def part(entries: list[dict], ns: str = NS):
    return part_of(ns, entries, [bson.encode(e) for e in entries])


def test_a_daemon_gets_the_entries_from_or_to_its_users_and_the_id_and_digest_of_the_rest():
    entries = [message(1, "a", "b"), message(2, "c", "d"), message(3, "d", "a"), message(4, "e", "f"),
               message(5, "c", "c")]
    p = part(entries)
    sent, passed = cut(p, {"a"})
    assert [bson.decode(e)["o"]["_id"] for e in sent] == [1, 3]  # a's as recipient and as sender
    assert unpack_passed(passed) == [(i, shown_digest(entries[i - 1]["o"])) for i in (2, 4, 5)]
    sent, passed = cut(p, {"c", "f"})
    assert [bson.decode(e)["o"]["_id"] for e in sent] == [2, 4, 5]
    assert [i for i, _ in unpack_passed(passed)] == [1, 3]
    sent, passed = cut(p, set())  # a daemon that holds nobody yet still sees every id
    assert sent == [] and [i for i, _ in unpack_passed(passed)] == [1, 2, 3, 4, 5]


def test_what_the_relay_cannot_route_goes_to_every_daemon_and_what_inserts_nothing_to_none():
    stray = {"op": "i", "ns": NS, "ts": Timestamp(9, 1), "o": {"_id": "not-an-id", "from": "a"}}
    txn = {"op": "c", "ns": "admin.$cmd", "ts": Timestamp(9, 2), "o": {"applyOps": [message(7, "x", "y")]}}
    update = {"op": "u", "ns": NS, "ts": Timestamp(9, 3), "o": {"$set": {"body": "z"}}, "o2": {"_id": 1}}
    assert key_of(stray, NS) == EVERY  # each daemon logs it as a stray, as it did before
    assert key_of(txn, NS) == EVERY
    assert key_of(update, NS) == NONE  # a daemon reads inserts only
    sent, passed = cut(part([stray, txn, update]), {"nobody"})
    assert [bson.decode(e)["op"] for e in sent] == ["i", "c"] and passed == b""


def test_frames_built_from_encoded_entries_decode_to_what_bson_would_encode():
    entries = [message(1, "a", "b"), message(2, "c", "d")]
    encoded = [bson.encode(e) for e in entries]
    assert whole_frame(encoded) == bson.encode({"b": entries})  # byte for byte: the frame of whole namespaces
    ts = Timestamp(START.time + 1, 2)
    decoded = bson.decode(batch_frame(NS, ts, encoded[:1], b"\x01" * 16), codec_options=AWARE)
    assert decoded == {"ns": NS, "ts": ts, "p": b"\x01" * 16, "b": entries[:1]}
    assert bson.decode(batch_frame(NS, ts, [], b"")) == {"ns": NS, "ts": ts, "p": b"", "b": []}


class UserDaemon:
    """A daemon's side routed by user: a RelayTail and the events it yields."""

    def __init__(self, client, path: str, since: Timestamp | None = START, name: str = "d"):
        self.tail = RelayTail(client, (NS,), path, by_user=True, name=name)
        self.tail.last_ts = since
        self.events: list = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.tail.batches():
            self.events.append(event)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def got(self) -> list[int]:
        """Ids whose entry came whole."""
        return [e["o"]["_id"] for ev in self.events if isinstance(ev, Batch) for e in ev.entries]

    def seen(self) -> list[int]:
        """Every id the stream counts: whole or passed over."""
        out = []
        for ev in self.events:
            if isinstance(ev, Batch):
                out += [e["o"]["_id"] for e in ev.entries] + [i for i, _ in unpack_passed(ev.passed)]
        return sorted(out)

    def marks(self) -> list[tuple[int, int]]:
        """(token, how many ids were seen before it) of each marker."""
        out, count = [], 0
        for ev in self.events:
            if isinstance(ev, Batch):
                count += len(ev.entries) + passed_count(ev.passed)
            elif isinstance(ev, Subscribed):
                out.append((ev.token, count))
        return out


def forwarded(name: str) -> float:
    return REGISTRY.get_sample_value("chat_relay_forwarded_total", {"daemon": name}) or 0.0


async def test_a_sub_is_marked_where_it_applies_an_unsub_stops_the_users_entries_and_a_reconnect_names_them_all(
        path, client):
    source = ListSource(NS)
    async with relay_on(source, path) as relay:
        one, two = UserDaemon(client, path, name="one"), UserDaemon(client, path, name="two")
        one.tail.users[NS].add("u1")  # held before it connects: its hello names it
        one.start()
        two.start()
        try:
            await eventually(lambda: relay.subscribers == 2, "both daemons subscribed")
            assert one.marks() == [(0, 0)] and two.marks() == [(0, 0)]  # the hello's: u1 is served from the start
            source.show([message(1, "s", "u1"), message(2, "s", "u2"), message(3, "u2", "u1")])
            await eventually(lambda: len(one.seen()) == 3 and len(two.seen()) == 3, "both saw 1..3")
            assert one.got() == [1, 3] and two.got() == []
            token = two.tail.want(NS, "u2")
            await eventually(lambda: len(two.marks()) == 2, "two's sub marked")
            assert two.marks()[-1] == (token, 3)  # from past id 3 on, u2's entries come
            source.show([message(4, "u2", "x"), message(5, "x", "u1")])
            await eventually(lambda: len(two.seen()) == 5 and len(one.seen()) == 5, "both saw 4, 5")
            assert two.got() == [4] and one.got() == [1, 3, 5]
            assert forwarded("one") == 3 and forwarded("two") == 1

            two.tail.drop(NS, "u2")
            await eventually(lambda: relay.users_of("two") == set(), "the relay applied two's unsub")
            source.show([message(6, "s", "u2")])  # the unsub went first on the same socket: not forwarded
            await eventually(lambda: len(two.seen()) == 6, "two saw 6")
            assert two.got() == [4] and forwarded("two") == 1

            # A reconnection: the hello names the set held now, and the ring is cut for it.
            await two.stop()
            two.tail.users[NS].add("u1")
            source.show([message(7, "s", "u1")])
            await eventually(lambda: len(one.seen()) == 7, "one saw 7")
            two.events.clear()
            two.start()
            await eventually(lambda: 7 in two.got(), "two resumed from the ring with u1's entry")
            assert not any(isinstance(ev, Restarted) for ev in two.events)
            assert two.got() == [7] and two.seen() == [6, 7]  # the batch of its last ts again, then the rest
        finally:
            await one.stop()
            await two.stop()


# What a daemon routed by user may send wrong: each is refused by closing its connection, nothing sent.
HOSTILE_HELLOS = [
    frame({"since": START, "ns": [NS], "users": ["u1"]}),  # users not by namespace
    frame({"since": START, "ns": [NS], "users": {NS: "u1"}}),  # a namespace's users not a list
    struct.pack("<i", HELLO_MAX + 1),  # a hello past its bound: nothing more is read
]
HOSTILE_REQUESTS = [
    struct.pack("<i", REQUEST_MAX + 1),  # a request past its bound
    frame({"sub": ["u1"], "ns": NS}),  # a sub without its number
    frame({"sub": "u1", "ns": NS, "n": 1}),  # users not a list
    frame({"unsub": ["u1"]}),  # no namespace
]


async def test_a_routed_hello_or_request_that_is_not_the_protocols_is_refused_and_the_relay_serves_on(path, client):
    source = ListSource(NS)
    async with relay_on(source, path) as relay:
        for data in HOSTILE_HELLOS:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(data)
            assert await asyncio.wait_for(reader.read(), PATIENCE) == b""  # closed, nothing sent
            writer.close()
        for data in HOSTILE_REQUESTS:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(frame({"since": START, "ns": [NS], "users": {NS: []}}))
            assert await asyncio.wait_for(read_frame(reader, 4096, AWARE), PATIENCE) == {"resumed": True}
            writer.write(data)
            assert await asyncio.wait_for(reader.read(), PATIENCE) == b""  # closed after the bad request
            writer.close()
        await eventually(lambda: relay.subscribers == 0, "every refused daemon dropped")
        daemon = UserDaemon(client, path, name="good")
        daemon.start()
        try:
            await eventually(lambda: relay.subscribers == 1, "a good daemon subscribed")
            daemon.tail.want(NS, "u1")
            await eventually(lambda: len(daemon.marks()) == 2, "its sub marked")
            source.show([message(1, "s", "u1"), message(2, "s", "u2")])
            await eventually(lambda: len(daemon.seen()) == 2, "it saw 1, 2")
            assert daemon.got() == [1]
        finally:
            await daemon.stop()
