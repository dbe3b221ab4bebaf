"""The host's oplog relay (relay/server.py) and a daemon's side of it
(relay/client.py), fed by a list of oplog events instead of a database.

The relay's logic needs no FerretDB: every entry reaches each daemon once
and in order, a daemon that reconnects resumes from the ring (or is told it
may have missed entries when the ring no longer covers it, or the relay's
own tail re-opened), each daemon gets the namespaces it asked for only, one
that stops reading is cut off without holding up the others, a hello that
is not the protocol's, or never comes, is refused, a relay whose tail fails
exits, and a daemon facing a relay that breaks the protocol reconnects and
takes nothing from it. The relay as a process on the real oplog, killed and
restarted behind real daemons, is tests/e2e/test_relay.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator

import bson
import pytest
from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.errors import InvalidBSON
from prometheus_client import REGISTRY

from chat.settings import RelaySettings, Settings, StoresSettings
from oplog.events import Batch, OplogEvent, Restarted
from relay import server as relay_server
from relay.client import RelayTail
from relay.protocol import FRAME_MAX, frame, read_frame
from relay.server import Relay
from tests.timing import PATIENCE, eventually

NS = "chat.messages"
CODEC = CodecOptions(tz_aware=True)  # as the relay's Mongo client decodes
START = Timestamp(1_700_000_000, 0)  # the newest entry when the tail opens


def entries(ids: range, ns: str = NS, body: str = "x") -> list[dict]:
    """Insert entries of ``ns`` as the oplog holds them, all after ``START``; id i at ts (START + 1, i + 1)."""
    return [{"op": "i", "ns": ns, "o": {"_id": i, "body": body}, "ts": Timestamp(START.time + 1, i + 1)}
            for i in ids]


class ListSource:
    """An ``oplog.events.OplogSource`` that hands on what the test appends, in
    order. Its first event is a ``Restarted`` at ``START``, as a real tail's
    first open is."""

    def __init__(self, *namespaces: str):
        self.namespaces = namespaces
        self.namespace = namespaces[0]
        self.last_ts: Timestamp | None = START
        self.events: list[OplogEvent] = [Restarted()]
        self._taken = 0
        self._appended = asyncio.Event()
        self._drained = asyncio.Event()

    async def newest_ts(self) -> Timestamp | None:
        return self.last_ts

    def show(self, batch: list[dict]) -> None:
        self._append(Batch(batch))

    def restart(self) -> None:
        self._append(Restarted())

    def _append(self, event: OplogEvent) -> None:
        self.events.append(event)
        self._drained.clear()
        self._appended.set()

    async def batches(self) -> AsyncIterator[OplogEvent]:
        while True:
            while self._taken < len(self.events):
                event = self.events[self._taken]
                self._taken += 1
                if isinstance(event, Batch):
                    self.last_ts = event.entries[-1]["ts"]
                yield event
            # The consumer asks for the next event only once it has handled this one.
            self._drained.set()
            self._appended.clear()
            await self._appended.wait()

    async def handled(self) -> None:
        """Until the relay has handled every event appended so far."""
        async with asyncio.timeout(PATIENCE):
            await self._drained.wait()


@contextlib.asynccontextmanager
async def relay_on(source: ListSource, path: str, **options) -> AsyncIterator[Relay]:
    """A Relay on ``source`` serving on the Unix socket ``path``, its tail open."""
    relay = Relay(source, CODEC, **options)
    tailing = asyncio.create_task(relay.run())
    server = await asyncio.start_unix_server(relay.serve, path)
    try:
        async with asyncio.timeout(PATIENCE):
            await relay.ready.wait()
        yield relay
    finally:
        server.close()
        relay.close()
        tailing.cancel()
        await asyncio.gather(tailing, return_exceptions=True)


class Daemon:
    """A daemon's side of the socket: a RelayTail read by a task, and what it got."""

    def __init__(self, client, path: str, *namespaces: str, since: Timestamp | None = START):
        self.tail = RelayTail(client, namespaces or (NS,), path)
        self.tail.last_ts = since  # as Stream.start() sets it: the newest entry at the daemon's start
        self.entries: list[dict] = []
        self.events: list[str] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.tail.batches():
            if isinstance(event, Restarted):
                self.events.append("restarted")
            else:
                self.entries.extend(event.entries)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def ids(self, ns: str | None = None) -> list[int]:
        return [e["o"]["_id"] for e in self.entries if e["op"] == "i" and (ns is None or e["ns"] == ns)]

    async def got(self, count: int, ns: str | None = None) -> None:
        await eventually(lambda: len(self.ids(ns)) >= count, f"{count} entries reach the daemon")


@contextlib.asynccontextmanager
async def reading(*daemons: Daemon) -> AsyncIterator[None]:
    for d in daemons:
        d.start()
    try:
        yield
    finally:
        for d in daemons:
            await d.stop()


async def test_every_entry_reaches_each_daemon_once_in_order_and_a_reconnect_resumes_from_the_ring(path, client):
    source = ListSource(NS)
    async with relay_on(source, path) as relay:
        # Two batches before the daemons connect (they come from the ring), three after (as they are read).
        source.show(entries(range(20)))
        source.show(entries(range(20, 40)))
        await source.handled()
        daemons = [Daemon(client, path), Daemon(client, path)]
        async with reading(*daemons):
            await eventually(lambda: relay.subscribers == 2, "both daemons subscribed")
            for n in range(2, 5):
                source.show(entries(range(n * 20, n * 20 + 20)))
            for d in daemons:
                await d.got(100)
                assert d.ids() == list(range(100))  # each once, in order: the ring's, then the live ones
                assert d.events == []  # the ring covered both from their start: nothing to read back

            # A daemon that goes away and comes back with its last ts gets what
            # it missed from the ring, not a Restarted (which would mean a read of the truth).
            await daemons[1].stop()
            source.show(entries(range(100, 120)))
            source.show(entries(range(120, 140)))
            await daemons[0].got(140)
            daemons[1].start()
            await daemons[1].got(100 + 60)
            # The batch that ends at its last ts comes again (its sequencer drops the repeats), then the rest.
            assert daemons[1].ids() == list(range(100)) + list(range(80, 140))
            assert daemons[1].events == []


async def test_a_daemon_past_the_ring_is_told_it_may_have_missed_entries(path, client):
    source = ListSource(NS)
    async with relay_on(source, path, ring_entries=10):
        for n in range(6):  # batches of 5; the ring keeps 10 entries or so: the daemon's start is gone
            source.show(entries(range(n * 5, n * 5 + 5)))
        await source.handled()
        daemon = Daemon(client, path)
        async with reading(daemon):
            await eventually(lambda: daemon.events, "the daemon's hello answered")
            assert daemon.events == ["restarted"]  # the stream reads the hole back from MySQL or Mongo
            source.show(entries(range(30, 35)))
            await daemon.got(5)
            assert daemon.ids() == list(range(30, 35))  # nothing of what the ring still had: it is not a resume


async def test_a_restart_of_the_relays_tail_is_passed_on_and_a_daemon_from_before_it_is_not_resumed(path, client):
    source = ListSource(NS)
    async with relay_on(source, path) as relay:
        connected = Daemon(client, path)
        async with reading(connected):
            await eventually(lambda: relay.subscribers == 1, "the daemon subscribed")
            source.show(entries(range(5)))
            source.restart()  # the relay's tail re-opened: it may have missed entries
            await source.handled()
            await eventually(lambda: connected.events, "the restart passed on")
            before = Daemon(client, path, since=START)  # from before the re-open: may have missed some
            after = Daemon(client, path, since=entries(range(4, 5))[0]["ts"])  # from the re-open's point
            async with reading(before, after):
                await eventually(lambda: before.events and after.ids(), "both late daemons answered")
                source.show(entries(range(5, 10)))
                await connected.got(10)
                await before.got(5)
                await after.got(10)
                assert connected.events == ["restarted"] and connected.ids() == list(range(10))
                assert before.events == ["restarted"] and before.ids() == list(range(5, 10))
                assert after.events == [] and after.ids() == list(range(10))


async def test_each_daemon_gets_the_entries_of_the_namespaces_it_asked_for_only(path, client):
    a, b, c = "chat.messages", "chat.messages_p1", "chat.messages_p2"
    source = ListSource(a, b, c)
    txn = {"op": "c", "ns": "admin.$cmd", "ts": Timestamp(START.time + 2, 1),  # a MongoDB transaction's entry
           "o": {"applyOps": [{"op": "i", "ns": b, "o": {"_id": 100}}]}}
    batch = [*entries(range(1, 2), a), *entries(range(2, 3), b), *entries(range(3, 4), c),
             *entries(range(4, 5), a), txn, *entries(range(5, 6), b)]
    batch[-1]["ts"] = Timestamp(START.time + 3, 1)  # after the transaction's entry
    async with relay_on(source, path) as relay:
        only_a, a_and_b = Daemon(client, path, a), Daemon(client, path, a, b)
        async with reading(only_a, a_and_b):
            # One that says no namespaces (the protocol allows it) gets every namespace the relay tails.
            every_reader, every_writer = await asyncio.open_unix_connection(path)
            every_writer.write(frame({"since": START}))
            await eventually(lambda: relay.subscribers == 3, "the three daemons subscribed")
            source.show(batch)
            await source.handled()
            late_c = Daemon(client, path, c)  # served from the ring: the same filter
            async with reading(late_c):
                await only_a.got(2)
                await a_and_b.got(4)
                await late_c.got(1)
                assert [(e["ns"], e["o"]["_id"]) for e in only_a.entries] == [(a, 1), (a, 4)]
                assert [(e["ns"], e["o"].get("_id")) for e in a_and_b.entries] == [
                    (a, 1), (a, 4), (b, 2), ("admin.$cmd", None), (b, 5)]
                assert late_c.ids() == [3]
            frames = [await asyncio.wait_for(read_frame(every_reader, FRAME_MAX, CODEC), PATIENCE) for _ in range(4)]
            every_writer.close()
            assert frames[0] == {"resumed": True}
            assert [[(e["ns"], e["o"].get("_id")) for e in f["b"]] for f in frames[1:]] == [
                [(a, 1), (a, 4)], [(b, 2), ("admin.$cmd", None), (b, 5)], [(c, 3)]]


async def test_a_daemon_that_stops_reading_is_cut_off_and_the_others_are_served(path, client):
    dropped = REGISTRY.get_sample_value("chat_relay_slow_subscribers_total") or 0.0
    source = ListSource(NS)
    async with relay_on(source, path, buffer_max=64 << 10) as relay:
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.setblocking(False)
        await asyncio.get_running_loop().sock_connect(stuck, path)
        stuck.sendall(frame({"since": START}))  # and never reads
        good = Daemon(client, path)
        try:
            async with reading(good):
                await eventually(lambda: relay.subscribers == 2, "both daemons subscribed")
                # Batches of 20 entries of 4 KB, each once the good one has read the one before,
                # until the stuck one is cut off: the socket's buffer in the kernel, then the
                # 64 KB the relay may hold for it, fill up, whatever the kernel's sizes.
                body, n = "y" * 4000, 0
                while relay.subscribers == 2:
                    assert n < 200, "the stuck daemon was never cut off"
                    source.show(entries(range(n * 20, n * 20 + 20), body=body))
                    n += 1
                    await good.got(n * 20)
                assert REGISTRY.get_sample_value("chat_relay_slow_subscribers_total") == dropped + 1
                source.show(entries(range(n * 20, n * 20 + 20), body=body))  # the others are served on
                await good.got(n * 20 + 20)
                assert good.ids() == list(range(n * 20 + 20))
            # The relay closed the stuck one: it reads what the kernel held, then the end.
            data = b""
            async with asyncio.timeout(PATIENCE):
                with contextlib.suppress(ConnectionResetError):
                    while chunk := await asyncio.get_running_loop().sock_recv(stuck, 1 << 20):
                        data += chunk
            got = []
            while len(data) >= 4 and len(data) >= (size := struct.unpack("<i", data[:4])[0]):
                got.append(bson.decode(data[:size]))
                data = data[size:]
            ids = [e["o"]["_id"] for f in got[1:] for e in f["b"]]
            assert got[0] == {"resumed": True}
            assert ids == list(range(len(ids))) and len(ids) < n * 20  # in order, and cut off short
        finally:
            stuck.close()


HOSTILE = [
    b"GET / HTTP/1.1\r\n\r\n",  # not BSON: its first 4 bytes read as a length far past the limit
    struct.pack("<i", 3),  # a length shorter than any document
    struct.pack("<i", 100) + b"\x00" * 10,  # a document that never finishes
    bson.encode({"since": "yesterday"}),  # BSON, but `since` is not a Timestamp
    bson.encode({"since": None, "ns": "chat.messages"}),  # `ns` is not a list
]


async def test_a_hello_that_is_not_the_protocols_is_refused_and_the_relay_serves_on(path, client):
    source = ListSource(NS)
    async with relay_on(source, path) as relay:
        for data in HOSTILE:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(data)
            if data.startswith(struct.pack("<i", 100)):
                writer.write_eof()
            assert await asyncio.wait_for(reader.read(), PATIENCE) == b""  # closed, nothing sent
            writer.close()
        # A good hello with anything after it: answered, then closed (a daemon sends nothing more).
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(frame({"since": START}) + b"more")
        answer = await asyncio.wait_for(reader.read(), PATIENCE)
        assert bson.decode(answer[:struct.unpack("<i", answer[:4])[0]]) == {"resumed": True}
        writer.close()
        assert relay.subscribers == 0
        daemon = Daemon(client, path, since=Timestamp(0, 0))
        async with reading(daemon):
            await eventually(lambda: daemon.events, "the daemon's hello answered")
            source.show(entries(range(5)))
            await daemon.got(5)
            assert daemon.ids() == list(range(5))


async def test_a_connection_that_never_says_hello_is_closed_after_the_hello_time(path):
    async with relay_on(ListSource(NS), path, hello_seconds=0.1):
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(struct.pack("<i", 40))  # a hello that starts and never finishes
        assert await asyncio.wait_for(reader.read(), PATIENCE) == b""  # closed by the relay, nothing sent
        writer.close()


async def test_a_daemon_whose_relay_goes_away_reconnects_to_the_next_and_is_told_it_may_have_missed_entries(
        path, client):
    first = ListSource(NS)
    daemon = Daemon(client, path)
    async with reading(daemon):
        async with relay_on(first, path):
            first.show(entries(range(5)))
            await daemon.got(5)
        # The next relay's tail opens later: what was written in between is not in its ring.
        second = ListSource(NS)
        second.last_ts = entries(range(9, 10))[0]["ts"]
        async with relay_on(second, path):
            await eventually(lambda: daemon.events, "the daemon reconnected")
            second.show(entries(range(10, 15)))
            await daemon.got(10)
    assert daemon.events == ["restarted"]  # ids 5..9 are a hole its stream reads back
    assert daemon.ids() == [*range(5), *range(10, 15)]


class _FailingTail:
    """A tail that fails with an error that is not the driver's (an entry that
    does not decode): the tailer's retry loop does not catch it."""

    def __init__(self, *args, **kwargs):
        pass

    async def batches(self):
        raise InvalidBSON("an oplog entry that does not decode")
        yield  # never reached: makes this an async generator

    def wake(self) -> None:
        """The writer's wake (oplog.wake): nothing to cut short here."""


async def test_a_relay_whose_tail_fails_exits_non_zero(tmp_path, monkeypatch):
    """Its daemons cannot be served: it exits, and supervisord starts a fresh one."""
    monkeypatch.setattr(relay_server, "OplogTail", _FailingTail)
    path = tmp_path / "failing.sock"
    settings = Settings(stores=StoresSettings(mongo_url="mongodb://127.0.0.1:9", redis_url=""),
                        relay=RelaySettings(socket=str(path), metrics_port=0))
    with pytest.raises(RuntimeError, match="the tail failed") as failed:
        await asyncio.wait_for(relay_server.run(settings), PATIENCE)
    assert isinstance(failed.value.__cause__, InvalidBSON)
    assert not path.exists()  # the next relay binds afresh


async def test_a_daemon_facing_a_relay_that_sends_what_is_not_the_protocols_reconnects_and_takes_nothing_from_it(
        path, client):
    # The daemon's side of the socket (relay.client): a frame past FRAME_MAX,
    # or bytes that are not BSON, end that connection and nothing else; the
    # daemon reconnects (its gap check covers the meantime) and goes on with
    # what a sound relay then sends.
    entry = {"op": "i", "ns": NS, "o": {"_id": 7}, "ts": Timestamp(1_700_000_000, 1)}
    answers = [
        struct.pack("<i", FRAME_MAX + 1),  # a hello claiming more than the limit
        frame({"resumed": True}) + struct.pack("<i", 12) + b"\xffnot bson",  # a batch that is not BSON
        frame({"resumed": True}) + frame({"b": [entry]}),
    ]
    hellos = []

    async def fake_relay(reader, writer):
        hellos.append(await read_frame(reader, 4096, bson.DEFAULT_CODEC_OPTIONS))
        writer.write(answers[min(len(hellos), len(answers)) - 1])
        await writer.drain()
        await reader.read(1)  # until the daemon leaves
        writer.close()

    server = await asyncio.start_unix_server(fake_relay, path)
    daemon = Daemon(client, path, since=None)
    try:
        async with reading(daemon):
            await daemon.got(1)
            # Everything the bad ones sent came before the good one's entry: nothing from
            # them, not even a restart (the third hello was answered `resumed`).
            assert daemon.ids() == [7] and daemon.events == []
            assert len(hellos) == 3 and daemon.tail.last_ts == entry["ts"]
    finally:
        server.close()

