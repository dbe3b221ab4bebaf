"""The host's oplog relay (relay/): one tail of the real FerretDB, its batches
passed to the daemons over a Unix socket.

In-process (the Relay on a real tail, real sockets): every entry reaches
each daemon's tail once and in order, a daemon that reconnects resumes from
the ring, one that stops reading is cut off without holding up the others,
a hello that is not the protocol's, or never comes, is refused, a relay
whose tail fails exits, and a daemon facing a relay that breaks the protocol
reconnects and takes nothing from it. As processes: a system
whose daemons tail through the relay delivers every message once, in order,
while the relay is killed and restarted.
"""

import asyncio
import contextlib
import signal
import socket
import struct
import uuid

import bson
import pytest
from bson import Timestamp
from bson.errors import InvalidBSON
from prometheus_client import REGISTRY

from chatctl.client import Inbox, listen
from db import mongo
from oplog.events import Restarted
from oplog.tail import OplogTail
from relay import server as relay_server
from relay.client import RelayTail
from relay.protocol import FRAME_MAX, frame, read_frame
from relay.server import Relay
from tests.e2e.helpers import post
from tests.system import databases, running_system


@pytest.fixture(scope="module")
def quiet_dbs(tmp_path_factory):
    # A FerretDB of their own: on the shared one, the shared system's daemons
    # poll the oplog too, and a tail that re-opens there (FerretDB fails a
    # getMore now and then under load) is passed on as a restart, which is
    # right, but not what these tests are about. An oplog of 5,000 entries:
    # on the usual 200 the relay's own tail fell off once in CI, on a slow
    # day, while a test wrote 400 entries in 4 s (what a fall-off does is
    # the system tests' subject, not these).
    with databases(tmp_path_factory.mktemp("relay"), oplog_max_docs=5000) as d:
        yield d


@contextlib.asynccontextmanager
async def relay_on(dbs, tmp_path, namespace: str, **options):
    """A Relay tailing ``namespace`` on the real FerretDB, serving on a socket;
    yields (relay, socket path, Mongo client)."""
    client = mongo.make_client(dbs.ferretdb.url, 5)
    relay = Relay(OplogTail(client, namespace, ferretdb_poll_seconds=0.02), client.codec_options, **options)
    path = str(tmp_path / f"relay-{uuid.uuid4().hex[:6]}.sock")
    tailing = asyncio.create_task(relay.run())
    server = await asyncio.start_unix_server(relay.serve, path)
    try:
        yield relay, path, client
    finally:
        server.close()
        relay.close()
        tailing.cancel()
        await asyncio.gather(tailing, return_exceptions=True)
        await client.close()


async def collect(tail: RelayTail, namespace: str, seen: list[int], events: list[str]) -> None:
    async for event in tail.batches():
        if isinstance(event, Restarted):
            events.append("restarted")
            continue
        seen.extend(e["o"]["_id"] for e in event.entries if e.get("op") == "i" and e.get("ns") == namespace)


async def until(check, timeout: float = 15) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


async def insert(client, namespace: str, ids: range, body: str = "x") -> None:
    db_name, coll_name = namespace.split(".")
    await client[db_name][coll_name].insert_many([{"_id": i, "body": body} for i in ids])


async def test_every_entry_reaches_each_daemon_once_in_order_and_a_reconnect_resumes_from_the_ring(quiet_dbs, tmp_path):
    namespace = f"relay{uuid.uuid4().hex[:6]}.messages"
    async with relay_on(quiet_dbs, tmp_path, namespace) as (relay, path, client):
        await asyncio.sleep(0.3)  # the relay's tail is open
        start = await OplogTail(client, namespace).newest_ts()
        tails = [RelayTail(client, namespace, path) for _ in range(2)]
        seen: list[list[int]] = [[], []]
        events: list[list[str]] = [[], []]
        for t in tails:
            t.last_ts = start  # as Stream.start() sets it: the newest entry at the daemon's start
        readers = [asyncio.create_task(collect(t, namespace, seen[k], events[k])) for k, t in enumerate(tails)]
        try:
            for n in range(5):
                await insert(client, namespace, range(n * 20, n * 20 + 20))
                await asyncio.sleep(0.1)
            await until(lambda: all(len(set(s)) >= 100 for s in seen))
            for s in seen:
                # each once (repeats of the resume entry aside), in order
                assert list(dict.fromkeys(s)) == list(range(100))
            assert events == [[], []]  # the ring covered both from their start: nothing to read back

            # A daemon that goes away and comes back with its last ts gets what
            # it missed from the ring, not a Restarted (which would mean a read of the truth).
            readers[1].cancel()
            await asyncio.gather(readers[1], return_exceptions=True)
            await insert(client, namespace, range(100, 140))
            await until(lambda: len(set(seen[0])) >= 140)
            readers[1] = asyncio.create_task(collect(tails[1], namespace, seen[1], events[1]))
            await until(lambda: len(set(seen[1])) >= 140)
            assert list(dict.fromkeys(seen[1])) == list(range(140))
            assert events[1] == []
        finally:
            for r in readers:
                r.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


async def test_a_daemon_past_the_ring_is_told_it_may_have_missed_entries(quiet_dbs, tmp_path):
    namespace = f"relay{uuid.uuid4().hex[:6]}.messages"
    async with relay_on(quiet_dbs, tmp_path, namespace, ring_entries=10) as (relay, path, client):
        await asyncio.sleep(0.3)
        tail = RelayTail(client, namespace, path)
        tail.last_ts = await OplogTail(client, namespace).newest_ts()
        for n in range(6):  # batches of 5; the ring keeps 10 entries or so: the start is gone
            await insert(client, namespace, range(n * 5, n * 5 + 5))
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        seen, events = [], []
        reader = asyncio.create_task(collect(tail, namespace, seen, events))
        try:
            await until(lambda: events)
            assert events[0] == "restarted"  # the stream reads the hole back from MySQL or Mongo
            await insert(client, namespace, range(30, 35))
            await until(lambda: set(range(30, 35)) <= set(seen))
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


async def test_a_daemon_that_stops_reading_is_cut_off_and_the_others_are_served(quiet_dbs, tmp_path):
    namespace = f"relay{uuid.uuid4().hex[:6]}.messages"
    async with relay_on(quiet_dbs, tmp_path, namespace, buffer_max=64 << 10) as (relay, path, client):
        await asyncio.sleep(0.3)
        dropped = REGISTRY.get_sample_value("chat_relay_slow_subscribers_total")
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(path)
        stuck.sendall(frame({"since": None}))  # and never reads
        good = RelayTail(client, namespace, path)
        good.last_ts = await OplogTail(client, namespace).newest_ts()
        seen, events = [], []
        reader = asyncio.create_task(collect(good, namespace, seen, events))
        try:
            await asyncio.sleep(0.3)
            body = "y" * 4000
            # 400 entries of 4 KB: far past the 64 KB the stuck one may hold.
            for n in range(20):
                await insert(client, namespace, range(n * 20, n * 20 + 20), body)
                await asyncio.sleep(0.2)
            await until(lambda: len(set(seen)) >= 400, timeout=30)
            assert list(dict.fromkeys(seen)) == list(range(400))
            # The relay closed the stuck one: once its buffer is drained it reads the end.
            stuck.settimeout(10)
            data = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := stuck.recv(1 << 20):
                    data += chunk
            assert len(data) < 1 << 20  # cut off: 400 entries of 4 KB are 1.6 MB
            assert REGISTRY.get_sample_value("chat_relay_slow_subscribers_total") == dropped + 1
        finally:
            stuck.close()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


async def test_a_hello_that_is_not_the_protocols_is_refused_and_the_relay_serves_on(quiet_dbs, tmp_path):
    namespace = f"relay{uuid.uuid4().hex[:6]}.messages"
    hostile = [
        b"GET / HTTP/1.1\r\n\r\n",  # not BSON: its first 4 bytes read as a length far past the limit
        struct.pack("<i", 3),  # a length shorter than any document
        struct.pack("<i", 100) + b"\x00" * 10,  # a document that never finishes
        bson.encode({"since": "yesterday"}),  # BSON, but `since` is not a Timestamp
    ]
    async with relay_on(quiet_dbs, tmp_path, namespace) as (relay, path, client):
        await asyncio.sleep(0.3)
        for data in hostile:
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(data)
            if data.startswith(struct.pack("<i", 100)):
                writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 15) == b""  # closed, nothing sent
            writer.close()
        # A good hello with anything after it: answered, then closed (a daemon sends nothing more).
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(frame({"since": await OplogTail(client, namespace).newest_ts()}) + b"more")
        answer = await asyncio.wait_for(reader.read(), 15)
        assert bson.decode(answer[:struct.unpack("<i", answer[:4])[0]])["resumed"] is True
        writer.close()
        tail = RelayTail(client, namespace, path)
        tail.last_ts = Timestamp(0, 0)
        seen, events = [], []
        task = asyncio.create_task(collect(tail, namespace, seen, events))
        try:
            await asyncio.sleep(0.3)
            await insert(client, namespace, range(5))
            await until(lambda: set(range(5)) <= set(seen))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_connection_that_never_says_hello_is_closed_after_the_hello_time(quiet_dbs, tmp_path):
    namespace = f"relay{uuid.uuid4().hex[:6]}.messages"
    async with relay_on(quiet_dbs, tmp_path, namespace, hello_seconds=0.3) as (relay, path, client):
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(struct.pack("<i", 40))  # a hello that starts and never finishes
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the relay, nothing sent
        writer.close()


class _FailingTail:
    """A tail that fails with an error that is not the driver's (an entry that
    does not decode): the tailer's retry loop does not catch it."""

    def __init__(self, *args, **kwargs):
        pass

    async def batches(self):
        raise InvalidBSON("an oplog entry that does not decode")
        yield  # never reached: makes this an async generator


async def test_a_relay_whose_tail_fails_exits_non_zero(quiet_dbs, tmp_path, monkeypatch):
    """Its daemons cannot be served: it exits, and supervisord starts a fresh one."""
    monkeypatch.setattr(relay_server, "OplogTail", _FailingTail)
    path = tmp_path / "failing.sock"
    settings = quiet_dbs.settings(oplog_relay_socket=str(path), metrics_port=0)
    with pytest.raises(RuntimeError, match="the tail failed") as failed:
        await asyncio.wait_for(relay_server.run(settings), 10)
    assert isinstance(failed.value.__cause__, InvalidBSON)
    assert not path.exists()  # the next relay binds afresh


async def test_daemons_behind_a_relay_killed_and_restarted_deliver_every_message_once_in_order(dbs, users):
    with running_system(dbs, daemons=2, apis=1, relay=True, CHAT_RATE_LIMIT_PER_SECOND=0,
                        CHAT_GAP_CHECK_SECONDS=1) as system:
        receivers = [users(f"r{i}") for i in range(8)]
        inboxes = {r: Inbox() for r in receivers}
        tasks = [asyncio.create_task(listen(system.ws_url, system.token(r), None, lambda f: None,
                                            max_backoff=0.5, inbox=inboxes[r])) for r in receivers]
        try:
            await asyncio.sleep(1.0)
            expected: dict[str, list[int]] = {r: [] for r in receivers}

            async def send(i: int) -> None:
                to = receivers[i % len(receivers)]
                r = await post(system, users("s"), to, f"m{i}", f"id-{i}")
                assert r.status_code == 201, r.text
                expected[to].append(int(r.json()["id"]))

            for i in range(60):
                await send(i)
                await asyncio.sleep(0.01)
            system.stop("relay", signal.SIGKILL)
            for i in range(60, 120):  # stored while no relay runs: the daemons' gap check finds them
                await send(i)
                await asyncio.sleep(0.01)
            system.start("relay")
            for i in range(120, 180):
                await send(i)
                await asyncio.sleep(0.01)
            async with asyncio.timeout(30):
                while not all(set(expected[r]) <= inboxes[r].seen for r in receivers):
                    await asyncio.sleep(0.1)
            for r in receivers:
                assert inboxes[r].duplicates == 0, f"{r} got a message twice"
                assert inboxes[r].ids == sorted(expected[r]), f"{r}: lost or out of order"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # The daemons did not tail the oplog themselves: the relay did, for both.
        assert "event=tail_mode" in (system.logdir / "relay.log").read_text()
        for name in ("daemon_0", "daemon_1"):
            text = (system.logdir / f"{name}.log").read_text()
            assert "event=tail_mode" not in text
            assert "event=relay_connected" in text


async def test_a_daemon_facing_a_relay_that_sends_what_is_not_the_protocols_reconnects_and_takes_nothing_from_it(
        quiet_dbs, tmp_path):
    # The daemon's side of the socket (relay.client): a frame past FRAME_MAX,
    # or bytes that are not BSON, end that connection and nothing else; the
    # daemon reconnects (its gap check covers the meantime) and goes on with
    # what a sound relay then sends.
    namespace = "bad.messages"
    entry = {"op": "i", "ns": namespace, "o": {"_id": 7}, "ts": Timestamp(1_700_000_000, 1)}
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

    path = str(tmp_path / "fake-relay.sock")
    server = await asyncio.start_unix_server(fake_relay, path)
    client = mongo.make_client(quiet_dbs.ferretdb.url, 5)
    tail = RelayTail(client, namespace, path)
    seen, events = [], []
    reader = asyncio.create_task(collect(tail, namespace, seen, events))
    try:
        await until(lambda: seen, timeout=10)
        await asyncio.sleep(0.3)
        assert seen == [7] and events == []  # nothing from the bad ones, not even a restart
        assert len(hellos) == 3 and tail.last_ts == entry["ts"]
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        server.close()
        await client.close()
