"""What each socket gets for unauthorised, hostile, oversized, slow and dead
peers: refused handshakes with clear statuses, documented close codes, and
no effect on other clients."""

import asyncio
import base64
import os
import re
import select
import signal
import socket
import time

import httpx
import psutil
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed, InvalidStatus

from chat.settings import Settings
from daemon.wire import FrameReader, Opcode
from tests.e2e.helpers import connect, post, receive
from harness.system import free_port, private_system, running_system
from tests.timing import PATIENCE, eventually


@pytest.fixture(scope="module")
def strict(dbs):
    """A system with small limits, so that each one can be reached quickly."""
    with running_system(dbs, daemons=1, apis=1, CHAT_PING_INTERVAL_SECONDS=1,
                        CHAT_PING_TIMEOUT_SECONDS=1, CHAT_WS_MAX_FRAME_BYTES=1024,
                        CHAT_WS_MAX_FRAMES_PER_SECOND=5, CHAT_RATE_LIMIT_PER_SECOND=0,
                        CHAT_ALLOWED_ORIGINS='["https://chat.example"]') as s:
        yield s


def connections(system) -> int:
    return httpx.get(f"http://127.0.0.1:{system.daemon_port}/healthz", timeout=PATIENCE).json()["connections"]


def daemon_metrics(system) -> dict[tuple[str, frozenset], float]:
    """(sample name, its labels) -> value, from the daemon's /metrics (one daemon per system here)."""
    text = httpx.get(f"http://127.0.0.1:{system.daemon_port}/metrics", timeout=PATIENCE).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def grew(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def refused(url: str, **kwargs) -> int:
    with pytest.raises(InvalidStatus) as info:
        await websockets.connect(url, **kwargs)
    return info.value.response.status_code


def held_by(system, ports: set[int]) -> set[int]:
    """Those of ``ports`` (the client ends) whose TCP connection the daemon holds open (one daemon per system here)."""
    daemon = psutil.Process(system.procs["daemon_0"].pid)
    return {c.raddr.port for c in daemon.net_connections("tcp") if c.raddr and c.raddr.port in ports}


def handshake(system, user: str) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET /v1/ws?token={system.token(user)} HTTP/1.1\r\nHost: x\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n").encode()


async def test_bad_tokens_and_origins_are_refused_before_accepting(strict, users):
    # (A handshake with no token at all is upgraded, to wait for its auth frame: tests/e2e/test_ws_auth.py.)
    url = f"{strict.ws_url}/v1/ws"
    assert await refused(url, additional_headers={"Authorization": "Bearer garbage"}) == 401
    assert await refused(url, origin="https://evil.example") == 403  # no token yet: the origin is refused first
    assert await refused(f"{url}?token=garbage") == 401
    assert await refused(f"{url}?token={strict.token(users('u'), ttl=-10)}") == 401
    token = strict.token(users("u"))
    assert await refused(f"{url}?token={token}", origin="https://evil.example") == 403
    ws = await websockets.connect(f"{url}?token={token}", origin="https://chat.example")
    await ws.close()
    ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"})
    await ws.close()  # returns once the daemon has closed it, and forgotten it before
    assert connections(strict) == 0  # nothing left behind by the refusals


async def test_oversized_inbound_frame_closes_with_1009(strict, users):
    ws, _ = await connect(strict, users("u"))
    await ws.send("x" * 2048)
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(ws.recv(), PATIENCE)
    assert info.value.rcvd.code == 1009


@pytest.mark.parametrize("frame", ["text", "unasked pong"])
async def test_inbound_frame_flood_closes_with_1008(strict, users, frame):
    # Pongs answer the server's pings; a stream of them that nobody asked for
    # counts against the inbound frame rate like any other frame, as acks do.
    ws, _ = await connect(strict, users("u"))
    with pytest.raises(ConnectionClosed) as info:
        for _ in range(50):
            await (ws.send('{"type": "ack", "upto": "1"}') if frame == "text" else ws.pong(b"x"))
            await asyncio.sleep(0.01)  # pacing: 100 frames a second, twenty times the limit
        await asyncio.wait_for(ws.recv(), PATIENCE)
    assert info.value.rcvd.code == 1008


@pytest.fixture(scope="module")
def patient(tmp_path_factory):
    """Pings far apart, so that a client that stops reading overflows its
    send buffer before it could be taken for a dead peer, and a short ping
    timeout, so a stalled close is cut off after the close stall (10 s): shorter, and the
    slow readers of the other tests here, which read one socket after another, would be
    cut off before they read their close frame.
    Databases of its own: the megabytes of 16 KB messages it posts would make
    every later full scan of the shared FerretDB (a daemon's start-up, an
    awaitData tail over 16 KB oplog entries) slow enough to fail other tests."""
    with private_system(tmp_path_factory.mktemp("patient"), daemons=1, apis=1, CHAT_SEND_BUFFER_MAX_BYTES=65536,
                        CHAT_PING_INTERVAL_SECONDS=60, CHAT_PING_TIMEOUT_SECONDS=1,
                        CHAT_RATE_LIMIT_PER_SECOND=0) as s:
        yield s


async def test_slow_consumer_is_closed_with_4008_and_others_are_unaffected(patient, users):
    strict = patient
    alice, slow, carol = users("alice"), users("slow"), users("carol")
    # This client stops reading (max_queue=1, a small receive buffer), so TCP
    # backpressure reaches the daemon and its queue for the client fills.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", strict.daemon_port))
    sluggish, _ = await connect(strict, slow, max_queue=1, sock=sock)
    healthy, _ = await connect(strict, carol)
    big = "😀" * 3990  # 16 KB frames: a few hundred overrun the kernel's buffers
    before = daemon_metrics(strict)

    async def flood() -> None:
        async with httpx.AsyncClient(timeout=PATIENCE) as c:
            for batch in range(10):
                await asyncio.gather(*(post(strict, alice, slow, f"{batch}.{i}:{big}", client=c) for i in range(40)))
                await post(strict, alice, carol, f"c{batch}", client=c)

    posting = asyncio.create_task(flood())
    # The client reads again as soon as the daemon has given up on it: one that read nothing
    # for the close stall (10 s) after that would be cut off before its close frame.
    await eventually(lambda: grew(before, daemon_metrics(strict), "chat_daemon_closes_total", reason="slow_consumer"),
                     "the slow consumer closed")
    with pytest.raises(ConnectionClosed) as info:
        async with asyncio.timeout(PATIENCE):
            while True:
                await sluggish.recv()
    assert info.value.rcvd.code == 4008
    await posting
    assert [f["body"] for f in await receive(healthy, 10)] == [f"c{i}" for i in range(10)]
    await healthy.close()


async def test_a_catch_up_bigger_than_the_send_buffer_is_paced_not_cut_off(patient, users):
    # bob was away while 400 messages of 16 KB (6.4 MB: 100 times the 64 KB
    # send buffer, and more than the kernel's socket buffers take) came for
    # him. He resumes with since on a socket with small buffers and reads
    # slowly: the catch-up goes out a page at a time as he reads, so he gets
    # all of them once, in order, and no 4008. Written at once, it overran the
    # buffer and the socket was closed as a slow consumer.
    alice, bob = users("alice"), users("bob")
    ws, hello = await connect(patient, bob)
    await ws.close()
    big = "😀" * 3990
    async with httpx.AsyncClient(timeout=PATIENCE) as c:
        for batch in range(10):
            await asyncio.gather(*(post(patient, alice, bob, f"{batch * 40 + i}:{big}", client=c) for i in range(40)))
    await eventually(lambda: connections(patient) == 0, "the first socket is gone")
    health = f"http://127.0.0.1:{patient.daemon_port}/healthz"
    await eventually(lambda: int(httpx.get(health, timeout=PATIENCE).json()["position"]) >= int(hello["cursor"]) + 400,
                     "the daemon has them all: the resume below is a catch-up, not live")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", patient.daemon_port))
    ws, again = await connect(patient, bob, since=hello["cursor"], max_queue=1, sock=sock)
    assert again["recovered"] is True
    # Not reading yet: with one frame queued the client stops reading its
    # socket, so the catch-up meets a full receive buffer (written at once, it overruns now).
    await eventually(lambda: not ws.transport.is_reading(), "the client's queue is full: it reads no more for now")
    got = []
    async with asyncio.timeout(PATIENCE):
        while len(got) < 400:
            got += await receive(ws, 1)
            await asyncio.sleep(0.002)  # pacing: a slow reader
    ids = [int(f["id"]) for f in got]
    assert ids == sorted(set(ids))  # in order, each once
    assert sorted(int(f["body"].split(":")[0]) for f in got) == list(range(400))  # every one
    await ws.close()


async def test_a_client_that_never_reads_its_close_is_cut_off_after_the_close_stall(patient, users):
    # A slow consumer is closed with 4008, but this one reads nothing at all,
    # so the close frame waits behind bytes it will never take. The daemon
    # must not hold the socket (and its buffers) forever: it aborts it.
    alice, mute = users("alice"), users("mute")
    before = connections(patient)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", patient.daemon_port))
    sock.sendall(handshake(patient, mute))
    sock.settimeout(PATIENCE)
    assert b"101" in sock.recv(4096).split(b"\r\n")[0]  # and nothing is read after this
    assert connections(patient) == before + 1
    port = sock.getsockname()[1]

    big = "😀" * 3990  # 16 KB frames: a few hundred overrun the kernel's buffers and the daemon's
    async with httpx.AsyncClient(timeout=PATIENCE) as c:
        for batch in range(20):
            await asyncio.gather(*(post(patient, alice, mute, f"{batch}.{i}:{big}", client=c) for i in range(40)))
            if connections(patient) == before:  # closed with 4008: its subscription is gone
                break
    assert connections(patient) == before, "the client never overran its send buffer"
    assert held_by(patient, {port})  # the close frame waits behind unread bytes: the socket is kept for now
    # cut off, though the client still has not read a byte
    await eventually(lambda: not held_by(patient, {port}), "the stalled connection is cut off",
                     timeout=Settings(_env_file=None).daemon.close_stall_seconds + PATIENCE)
    sock.close()


async def test_half_open_peer_is_pinged_then_dropped_without_a_close(strict, users):
    # When (the first tick past the ping timeout) is shown on a fake clock, in
    # tests/core/test_heartbeats.py; here, what such a peer gets on the wire.
    counted = daemon_metrics(strict)
    reader, writer = await asyncio.open_connection("127.0.0.1", strict.daemon_port)
    writer.write(handshake(strict, users("ghost")))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PATIENCE)
    assert head.startswith(b"HTTP/1.1 101")
    # ...and never answers a ping (the peer vanished without a FIN): it reads until the daemon lets it go
    frames, parse = [], FrameReader(None, mask=False)
    async with asyncio.timeout(PATIENCE):
        try:
            while data := await reader.read(65536):
                frames += parse.feed(data)
        except ConnectionResetError:
            pass
    writer.close()
    # the hello, one ping (none more while it is unanswered), and the end: no close handshake with a dead peer
    assert [f.opcode for f in frames] == [Opcode.TEXT, Opcode.PING]
    assert grew(counted, daemon_metrics(strict), "chat_daemon_closes_total", reason="ping_timeout") == 1


async def test_metrics_show_connections_pushes_latency_lag_catch_ups_and_gc_pauses(strict, users):
    alice, bob = users("alice"), users("bob")
    before = daemon_metrics(strict)
    ws, _ = await connect(strict, bob)
    ids = [(await post(strict, alice, bob, f"m{i}")).json()["id"] for i in range(3)]
    assert [f["id"] for f in await receive(ws, 3)] == ids
    again, hello = await connect(strict, bob, since=ids[0])  # a second device that missed two
    assert [f["id"] for f in await receive(again, 2)] == ids[1:]
    after = daemon_metrics(strict)
    assert after[("chat_daemon_connections", frozenset({("kind", "ws")}))] >= 2
    assert grew(before, after, "chat_daemon_pushes_total") >= 3
    assert grew(before, after, "chat_daemon_oplog_to_socket_seconds_count") >= 3
    assert grew(before, after, "chat_daemon_catchups_total", source="cache") >= 1
    assert after[("chat_daemon_stream_position", frozenset())] >= int(ids[-1])
    assert 0 <= after[("chat_daemon_tail_lag_seconds", frozenset())] < 60
    # every generation's pauses are exposed from the start, even before the first pass
    for generation in "012":
        assert ("chat_daemon_gc_pause_seconds_count", frozenset({("generation", generation)})) in after
    await ws.close()
    await again.close()


@pytest.fixture
def no_daemon_yet(tmp_path_factory):
    """Databases of its own (the test hangs FerretDB) and no process started."""
    with private_system(tmp_path_factory.mktemp("starting"), daemons=0, apis=0) as s:
        yield s


async def test_a_starting_daemon_refuses_with_503_until_its_stream_is_ready(no_daemon_yet, users):
    # With FerretDB hung, a new daemon listens but cannot read its stream's
    # start: clients are told to retry elsewhere, not left waiting on it.
    s, user = no_daemon_yet, users("early")
    ferretdb = s.dbs.ferretdb.proc
    ferretdb.send_signal(signal.SIGSTOP)
    try:
        proc = s.start("daemon_0", wait=False)
        base = f"http://127.0.0.1:{s.daemon_port}"
        assert httpx.get(f"{base}/healthz").json()["status"] == "starting"
        with pytest.raises(InvalidStatus) as info:
            await websockets.connect(f"{s.ws_url}/v1/ws?token={s.token(user)}")
        assert info.value.response.status_code == 503
        assert info.value.response.headers["Retry-After"] == "1"
        r = httpx.get(f"{base}/v1/poll", params={"timeout": "0"},
                      headers={"Authorization": f"Bearer {s.token(user)}"})
        assert (r.status_code, r.json()["error"], r.headers["retry-after"]) == (503, "try_again_later", "1")
    finally:
        ferretdb.send_signal(signal.SIGCONT)
    s.wait_ready("daemon_0", pid=proc.pid)
    ws, hello = await connect(s, user)
    assert hello["type"] == "hello"
    await ws.close()


async def test_over_capacity_gets_503_try_again_later(dbs, users):
    with running_system(dbs, daemons=1, apis=0, CHAT_MAX_CONNECTIONS=2) as s:
        a, _ = await connect(s, users("a"))
        b, _ = await connect(s, users("b"))
        url = f"{s.ws_url}/v1/ws?token={s.token(users('c'))}"
        assert await refused(url) == 503
        await a.close()  # returns once the daemon has closed the socket: it counts no more
        c, _ = await connect(s, users("c"))  # room again
        await b.close()
        await c.close()


async def test_sockets_mid_handshake_count_toward_the_cap_and_idle_ones_are_closed(dbs, users):
    # Two sockets that never finish a request (one silent, one trickling a
    # head, as slowloris does) hold file descriptors like WebSockets: with a
    # cap of 2 the next handshake is refused. The daemon closes both once
    # they have been idle for CHAT_HTTP_IDLE_SECONDS, and there is room again.
    # When (the first heartbeat tick past the limit) is shown on a fake clock,
    # in tests/core/test_heartbeats.py; here, what the sockets see.
    idle_seconds = 1
    with running_system(dbs, daemons=1, apis=0, CHAT_MAX_CONNECTIONS=2, CHAT_HTTP_IDLE_SECONDS=idle_seconds) as s:
        created = time.monotonic()
        silent = socket.create_connection(("127.0.0.1", s.daemon_port))
        trickle = socket.create_connection(("127.0.0.1", s.daemon_port))
        trickle.sendall(b"GET /v1/ws?tok")
        ports = {silent.getsockname()[1], trickle.getsockname()[1]}
        # Held by the daemon, so counted before any later connection is (accepted in order).
        await eventually(lambda: held_by(s, ports) == ports, "the daemon holds both sockets")
        url = f"{s.ws_url}/v1/ws?token={s.token(users('c'))}"
        assert await refused(url) == 503
        for chunk in b"en=x HTTP/1.1\r\nHost: x\r\n":  # never a whole head
            try:
                trickle.send(bytes([chunk]))
            except OSError:
                break
            await asyncio.sleep(0.1)  # pacing: a slowloris trickle, a byte every 0.1 s
        for sock in (silent, trickle):
            sock.settimeout(PATIENCE)
            try:
                assert sock.recv(1024) == b""  # closed by the daemon, nothing said
            except ConnectionResetError:
                pass  # closed with the trickled bytes unread: a reset
            sock.close()
        # idle for the limit, then closed, not refused at once (the trickle did not count as a request)
        assert time.monotonic() - created >= idle_seconds
        c, _ = await connect(s, users("c"))  # room again
        await c.close()
        closes = daemon_metrics(s)[("chat_daemon_closes_total", frozenset({("reason", "http_idle")}))]
        assert closes >= 2
        # A long poll is a request in hand, not an idle connection: it gets its answer.
        started = time.monotonic()
        async with httpx.AsyncClient(timeout=PATIENCE) as client:
            r = await client.get(s.poll_url, params={"timeout": "2.5"},
                                 headers={"Authorization": f"Bearer {s.token(users('d'))}"})
        assert r.status_code == 200 and r.json()["messages"] == [] and time.monotonic() - started >= 2.4


async def test_sigterm_closes_clients_with_1012_and_they_resume_elsewhere(dbs, users):
    with running_system(dbs, daemons=1, apis=1, CHAT_RATE_LIMIT_PER_SECOND=0) as s:
        alice, bob = users("alice"), users("bob")
        ws, _ = await connect(s, bob)
        first = (await post(s, alice, bob, "before")).json()
        assert (await receive(ws, 1))[0]["id"] == first["id"]
        s.stop("daemon_0")
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), PATIENCE)
        assert info.value.rcvd.code == 1012
        await post(s, alice, bob, "while restarting")
        s.start("daemon_0")
        ws, hello = await connect(s, bob, since=first["id"])
        assert hello["recovered"] is True
        assert [f["body"] for f in await receive(ws, 1)] == ["while restarting"]
        await ws.close()


def raw_http(system, request: bytes, expect: int = 1) -> list[bytes]:
    """Sends raw bytes to the daemon; returns the status lines of ``expect`` answers."""
    with socket.create_connection(("127.0.0.1", system.daemon_port), timeout=PATIENCE) as sock:
        sock.sendall(request)
        data = b""
        while data.count(b"HTTP/1.1 ") < expect or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return [line for line in data.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


async def test_request_head_over_16_kib_gets_431_and_the_socket_closes(strict):
    status = raw_http(strict, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 17_000 + b"\r\n\r\n")
    assert status == [b"HTTP/1.1 431 Request Header Fields Too Large"]


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"\x16\x03\x01\x02\x00garbage, not HTTP\r\n\r\n", b"HTTP/1.1 400 Bad Request"),  # e.g. TLS to a plain port
    (b"GET /v1/poll HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
    (b"POST /v1/poll HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", b"HTTP/1.1 405 Method Not Allowed"),
    (b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Version: 13\r\n\r\n", b"HTTP/1.1 400 Bad Request"),  # no Sec-WebSocket-Key
    (b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 7\r\n\r\n",
     b"HTTP/1.1 426 Upgrade Required"),  # an old protocol version
])
async def test_malformed_requests_and_handshakes_get_a_clear_status(strict, request_bytes, status):
    assert raw_http(strict, request_bytes) == [status]


async def test_an_unsupported_websocket_version_is_told_which_one_to_use(strict):
    request = (b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 7\r\n\r\n")
    with socket.create_connection(("127.0.0.1", strict.daemon_port), timeout=PATIENCE) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 426 ") and b"\r\nSec-WebSocket-Version: 13\r\n" in data


async def test_plain_get_on_the_websocket_path_gets_426(strict):
    assert raw_http(strict, b"GET /v1/ws HTTP/1.1\r\nHost: x\r\n\r\n") == [b"HTTP/1.1 426 Upgrade Required"]


async def test_pipelined_requests_are_answered_in_order_past_the_pipeline_bound(strict):
    # 40 requests in one write: more than PIPELINE_MAX (16) wait while reading pauses
    requests = b"".join(f"GET /nope{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(40))
    with socket.create_connection(("127.0.0.1", strict.daemon_port), timeout=PATIENCE) as sock:
        sock.sendall(requests)
        data = b""
        while data.count(b"HTTP/1.1 404") < 40:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            data += chunk
    assert [int(x) for x in re.findall(rb"no route /nope(\d+)", data)] == list(range(40))


async def test_unmasked_client_frame_closes_with_1002(strict, users):
    ws, _ = await connect(strict, users("u"))
    ws.transport.write(b"\x81\x02hi")  # an unmasked text frame; the library would mask it
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(ws.recv(), PATIENCE)
    assert info.value.rcvd.code == 1002


def masked(opcode: int, payload: bytes) -> bytes:
    """One client frame, FIN set, masked as RFC 6455 requires of clients."""
    key = os.urandom(4)
    assert len(payload) < 126
    return (bytes((0x80 | opcode, 0x80 | len(payload))) + key
            + bytes(b ^ key[i % 4] for i, b in enumerate(payload)))


async def test_close_reason_that_is_not_utf8_closes_with_1007(strict, users):
    ws, _ = await connect(strict, users("u"))
    ws.transport.write(masked(0x8, (1000).to_bytes(2, "big") + b"\xff\xfe bad"))  # a close, reason not UTF-8
    with pytest.raises(ConnectionClosed) as info:
        await asyncio.wait_for(ws.recv(), PATIENCE)
    assert info.value.rcvd.code == 1007


async def test_a_poll_without_timeout_waits_the_default_or_the_cap_if_lower(dbs, users):
    with running_system(dbs, daemons=1, apis=0, CHAT_POLL_MAX_TIMEOUT_SECONDS=1) as s:
        async with httpx.AsyncClient(timeout=PATIENCE) as client:
            started = time.monotonic()
            asked = asyncio.create_task(client.get(s.poll_url,  # no timeout given
                                                   headers={"Authorization": f"Bearer {s.token(users('u'))}"}))
            # The daemon's own timer as the yardstick, not the wall clock: polls
            # that ask for the 1 s cap, one after another, while the first waits.
            capped = 0
            while not asked.done():
                r = await client.get(s.poll_url, params={"timeout": "1"},
                                     headers={"Authorization": f"Bearer {s.token(users('v'))}"})
                assert r.status_code == 200 and r.json()["messages"] == []
                capped += 1
            r = await asked
        assert r.status_code == 200, r.text  # not a 422 for the 25 s default, over the cap
        assert r.json()["messages"] == []  # nobody wrote to this user: it waited, then answered empty
        assert time.monotonic() - started >= 0.9  # it waited...
        assert capped <= 3  # ...about as long as one 1 s poll (the cap), not 25 of them (the default)


async def test_past_the_ceiling_a_connection_gets_503_at_once_and_is_closed(dbs, users):
    """With a cap of 2 the ceiling is 2 + 64 open sockets. 72 silent sockets
    (no request, ever): those past the ceiling are told 503 and closed at
    accept, the rest stay open and wait for their request. So silent sockets
    cannot take every file descriptor of the daemon.

    "About" 66 stay open: a connection the harness used a moment before may
    still count until the daemon has seen it close."""
    with running_system(dbs, daemons=1, apis=0, CHAT_MAX_CONNECTIONS=2, CHAT_HTTP_IDLE_SECONDS=30) as s:
        daemon = psutil.Process(s.procs["daemon_0"].pid)
        silent = [socket.create_connection(("127.0.0.1", s.daemon_port)) for _ in range(72)]
        ports = {sock.getsockname()[1] for sock in silent}
        try:
            refused: dict[socket.socket, bytes] = {}
            deadline = time.monotonic() + PATIENCE
            while time.monotonic() < deadline:  # until the daemon has taken or refused every one
                readable, _, _ = select.select([x for x in silent if x not in refused], [], [], 0.2)
                for sock in readable:
                    answer = b""
                    while chunk := sock.recv(4096):  # said without a request, then closed
                        answer += chunk
                    refused[sock] = answer
                held = {c.raddr.port for c in daemon.net_connections() if c.raddr and c.raddr.port in ports}
                if len(held) + len(refused) == 72:
                    break
            assert len(held) + len(refused) == 72, (len(held), len(refused))
            assert 60 <= len(held) <= 66
            for answer in refused.values():
                assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer
                assert b'"error":"try_again_later"' in answer
        finally:
            for sock in silent:
                sock.close()
        await eventually(lambda: not held_by(s, ports), "the daemon has closed its ends of the silent sockets")
        c, _ = await connect(s, users("c"))  # room again
        await c.close()


async def test_each_process_serves_its_own_metrics_on_its_metrics_port(dbs, users):
    """CHAT_METRICS_PORT: the registry of that one process, whichever process
    the shared port would have picked (supervisord.conf gives each its own)."""
    for module in ("daemon", "api"):
        port = free_port()
        counts = {"daemons": 1, "apis": 0} if module == "daemon" else {"daemons": 0, "apis": 1}
        with running_system(dbs, **counts, CHAT_METRICS_PORT=port) as s:
            pid = s.procs[f"{module}_0"].pid
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE).text
            names = {f.name for f in text_string_to_metric_families(text)}
            if module == "daemon":
                assert f'chat_daemon_info{{pid="{pid}"}} 1.0' in text and "chat_daemon_connections" in names
            else:
                assert "chat_api_requests" in names and "chat_writer_batch_messages" in names


@pytest.fixture
def no_recent_cache(tmp_path_factory):
    """Databases of its own (the test freezes FerretDB), and a daemon with no recent cache:
    every catch-up reads the fast store."""
    with private_system(tmp_path_factory.mktemp("no-cache"), daemons=1, apis=1, CHAT_RECENT_CACHE_MAX="0") as s:
        yield s


async def test_a_catch_up_the_store_does_not_answer_is_try_again_not_a_server_error(no_recent_cache, users):
    s, alice, bob = no_recent_cache, users("alice"), users("bob")
    live, _ = await connect(s, bob)
    assert (await post(s, alice, bob, "kept")).status_code == 201
    [frame] = await receive(live, 1)  # the daemon's position is past it: a catch-up from 0 reads the store
    ferretdb = s.dbs.ferretdb.proc
    ferretdb.send_signal(signal.SIGSTOP)
    try:
        headers = {"Authorization": f"Bearer {s.token(bob)}"}
        ws = await websockets.connect(f"{s.ws_url}/v1/ws?since=0", additional_headers=headers)
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(PATIENCE):
                await ws.recv()  # no hello: the first page never came
        assert (ws.close_code, ws.close_reason) == (1013, "the message store did not answer in time: retry")
        async with httpx.AsyncClient(timeout=PATIENCE) as client:
            r = await client.get(f"http://127.0.0.1:{s.daemon_port}/v1/poll", params={"since": "0", "timeout": "0"},
                                 headers=headers)
        assert (r.status_code, r.json()["error"], r.headers["retry-after"]) == (503, "try_again_later", "1")
    finally:
        ferretdb.send_signal(signal.SIGCONT)
    again, hello = await connect(s, bob, since="0")  # what the client does next: nothing was lost
    assert hello["recovered"] is True
    assert [f["id"] for f in await receive(again, 1)] == [frame["id"]]
    await again.close()
    await live.close()


@pytest.fixture
def routed_behind_a_relay(tmp_path_factory):
    """Databases of its own (the test freezes MariaDB), one daemon routed by user behind the
    relay, as deployed: a user's first socket that resumes from before the daemon held it
    reads its part of the range from MySQL, by the user."""
    with private_system(tmp_path_factory.mktemp("routed-mysql"), daemons=1, apis=1, writer=True, relay=True,
                        CHAT_RELAY_ROUTE_BY_USER="true", CHAT_DB_TIMEOUT_SECONDS="1") as s:
        yield s


async def test_a_routed_catch_up_mysql_does_not_answer_is_try_again_not_a_server_error(routed_behind_a_relay, users):
    s, alice, bob, carol = routed_behind_a_relay, users("alice"), users("bob"), users("carol")
    live, _ = await connect(s, bob)  # the stream's position moves past carol's message, which it does not hold
    assert (await post(s, alice, carol, "kept")).status_code == 201
    assert (await post(s, alice, bob, "after it")).status_code == 201
    await receive(live, 1)
    mariadb = s.dbs.mariadb.proc
    mariadb.send_signal(signal.SIGSTOP)  # FerretDB answers: only a read of MySQL can fail to
    try:
        headers = {"Authorization": f"Bearer {s.token(carol)}"}
        ws = await websockets.connect(f"{s.ws_url}/v1/ws?since=0", additional_headers=headers)
        with pytest.raises(ConnectionClosed):
            async with asyncio.timeout(PATIENCE):
                await ws.recv()  # no hello: the catch-up's read of MySQL never answered
        assert (ws.close_code, ws.close_reason) == (1013, "the message store did not answer in time: retry")
    finally:
        mariadb.send_signal(signal.SIGCONT)
    again, hello = await connect(s, carol, since="0")  # what the client does next: nothing was lost
    assert hello["recovered"] is True
    assert [f["body"] for f in await receive(again, 1)] == ["kept"]
    await again.close()
    await live.close()
