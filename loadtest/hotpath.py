"""The Python share of a daemon's cost per message, with no socket.

The replay benchmark (loadtest/replay.py) measures a daemon whole: about
17 us of CPU per one-frame message, of which about 10 us is the socket
``write()`` (on loopback the kernel runs the receiver's TCP in that call).
This one times only what runs in Python for each message: ``Consumer.take``
(oplog entries -> documents -> sequencer -> encode -> cache -> hub ->
``Connection.send``) for replay-shaped oplog entries, with
10,000 live connections whose transports only keep what they are given.
The loop runs between batches, as it does between the consumer's turns, so
frames a connection holds for the loop's next turn are written in the time
measured. No database, no network, one process: quick to rerun after a change
to the hot path, and steadier than the replay on a noisy machine.

Each socket's bytes are read back afterwards: every message must arrive as
its own WebSocket text frame, in id order, on each socket it was sent to
(``writes`` says how many ``write()`` calls carried them: a socket given
several messages between two turns of the loop gets them in one).

    python -m loadtest.hotpath                # 300,000 messages, 3 rounds
    python -m loadtest.hotpath --senders-online --clients 200   # two frames a message, sockets that get several a batch
    python -m loadtest.hotpath --tcp --clients 4000    # real loopback sockets: the kernel's share too
    python -m loadtest.hotpath --out hotpath.json
    valgrind --tool=callgrind --instr-atstart=no python -m loadtest.hotpath --callgrind --count 20000 --rounds 1
        # instructions in the timed window only, which the machine's load does not move

With ``--tcp`` each connection is a real loopback TCP socket on uvloop, its
peer read by a thread of this process, and the time is the event loop
thread's CPU alone (``time.thread_time``): Python and the ``write()`` system
calls, which on loopback run the receiver's TCP too, as in a daemon.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import selectors
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from collections.abc import Sequence
from types import SimpleNamespace
from typing import cast

import orjson
import typer
import uvloop

from chat.settings import Settings
from daemon import metrics
from daemon.client_frames import ClientFrames
from daemon.connection import Connection, ServerState
from daemon.http_phase import Request
from daemon.hub import Hub, Subscriber
from daemon.stream import Stream
from oplog.events import Batch

NAMESPACE = "chat.messages"


class CountingTransport(asyncio.Transport):
    """What a live connection writes to: keeps what it is given, never backs up."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes | bytearray | memoryview] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


class Unrouted:
    """The handler of connections that are live from the start: no request reaches it."""

    async def handle_upgrade(self, conn: Connection, request: Request) -> bool:
        raise AssertionError("the hot path serves no handshake")

    async def handle_http(self, conn: Connection, request: Request) -> None:
        raise AssertionError("the hot path serves no request")

    def forget(self, conn: Connection) -> None:
        """No connection closes here."""

    def client_frames(self, conn: Connection) -> ClientFrames:
        raise AssertionError("the hot path's clients send nothing")


def oplog_batches(clients: int, count: int, batch: int, seed: int = 7, senders_online: bool = False) -> list[Batch]:
    """Insert entries as FerretDB writes them, one recipient per message; the
    sender offline (one frame each, the replay's --senders-offline) or, with
    ``senders_online``, one of the clients too (two frames each)."""
    rng, now = random.Random(seed), datetime.now(UTC)
    sender = "r" if senders_online else "x"
    return [Batch([{"op": "i", "ns": NAMESPACE, "o": {
        "_id": i + 1, "from": f"{sender}{rng.randrange(clients)}", "to": f"r{rng.randrange(clients)}",
        "body": f"{time.time():.6f} replay", "created_at": now, "client_msg_id": None}}
        for i in range(start, min(start + batch, count))]) for start in range(0, count, batch)]


def frame_ids(chunks: Sequence[bytes | bytearray | memoryview]) -> list[int]:
    """The ids of the text frames in what one socket was given, in order; raises
    on anything but whole, unmasked, final text frames of the daemon's payloads."""
    data, ids, at = b"".join(chunks), [], 0
    while at < len(data):
        if data[at] != 0x81:
            raise SystemExit(f"hotpath: not a final text frame at byte {at}: {data[at]:#x}")
        n, at = data[at + 1], at + 2
        if n & 0x80:
            raise SystemExit("hotpath: a server frame is never masked")
        if n == 126:
            n, at = int.from_bytes(data[at:at + 2], "big"), at + 2
        elif n == 127:
            n, at = int.from_bytes(data[at:at + 8], "big"), at + 8
        if at + n > len(data):
            raise SystemExit("hotpath: a frame cut short")
        ids.append(int(orjson.loads(data[at:at + n])["id"]))
        at += n
    return ids


class Peers(threading.Thread):
    """The clients' ends of ``--tcp``'s sockets: read until each is closed, what each got kept."""

    def __init__(self, socks: list[socket.socket]):
        super().__init__(daemon=True)
        self.got: dict[socket.socket, list[bytes]] = {s: [] for s in socks}
        self.socks = socks

    def run(self) -> None:
        selector, open_ = selectors.DefaultSelector(), len(self.socks)
        for sock in self.socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        while open_:
            for key, _ in selector.select():
                sock = cast(socket.socket, key.fileobj)
                data = sock.recv(1 << 18)
                if data:
                    self.got[sock].append(data)
                else:
                    selector.unregister(sock)
                    sock.close()
                    open_ -= 1


async def tcp_transports(conns: list[Connection]) -> tuple[list[asyncio.Transport], Peers]:
    """A loopback TCP connection per ``conn``, the daemon's end a uvloop transport."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    port, peers, transports = listener.getsockname()[1], [], []
    for conn in conns:
        peer = socket.create_connection(("127.0.0.1", port))
        ours, _ = listener.accept()
        peers.append(peer)
        transport, _ = await loop.connect_accepted_socket(lambda c=conn: c, ours)  # type: ignore[misc]
        transports.append(transport)
    listener.close()
    reader = Peers(peers)
    reader.start()
    return transports, reader


def callgrind(on: bool) -> None:
    """Switches valgrind's instrumentation of this process (run under ``--instr-atstart=no``)."""
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], check=True,
                   capture_output=True)


async def one_round(clients: int, count: int, batch: int, senders_online: bool = False, tcp: bool = False,
                    counted: bool = False) -> dict:
    settings = Settings()
    hub = Hub(settings.daemon.send_buffer_max_bytes)
    state, handler = ServerState(settings), Unrouted()
    conns = [Connection(state, handler) for _ in range(clients)]
    if tcp:
        transports, peers = await tcp_transports(conns)
    else:
        transports = [CountingTransport() for _ in conns]
    for i, (conn, transport) in enumerate(zip(conns, transports, strict=True)):
        conn.transport, conn.http = transport, None
        state.http_conns.discard(conn)
        conn.subscriber = Subscriber(conn, f"r{i}")
        conn.subscriber.pending = None  # live
        hub.register(conn.subscriber)
    # No database: only a catch-up reads it, and every connection here is live from the start.
    stream = Stream(None, SimpleNamespace(namespace=NAMESPACE), hub,  # type: ignore[arg-type]
                    retention_seconds=settings.stores.retention_seconds,
                    cache_max=settings.daemon.recent_cache_max, gap_check_seconds=3600,
                    cache_max_bytes=settings.daemon.recent_cache_max_bytes)
    batches = oplog_batches(clients, count, batch, senders_online=senders_online)
    gc.collect()
    clock = time.thread_time if tcp else time.process_time
    if counted:
        callgrind(True)
    cpu = clock()
    for oplog_batch in batches:
        stream.consumer.take(oplog_batch, time.perf_counter())  # what Consumer.run does with each oplog batch
        await asyncio.sleep(0)  # the loop's turn between two batches: what is corked is written
    cpu = clock() - cpu
    if counted:
        callgrind(False)
    if tcp:
        while any(t.get_write_buffer_size() for t in transports):
            await asyncio.sleep(0.01)
        for transport in transports:
            transport.close()
        while peers.is_alive():
            await asyncio.sleep(0.01)
        writes = 0  # not seen on a real socket
        got = [frame_ids(peers.got[s]) for s in peers.socks]
    else:
        writes = sum(len(t.written) for t in transports if isinstance(t, CountingTransport))
        got = [frame_ids(t.written) for t in transports if isinstance(t, CountingTransport)]
    frames = sum(len(ids) for ids in got)
    want = count * 2 if senders_online else count
    if stream.position != count or frames != want - same_user(batches):
        raise SystemExit(f"hotpath: released {stream.position} and wrote {frames} frames for {count} messages")
    if any(ids != sorted(set(ids)) for ids in got):
        raise SystemExit("hotpath: a socket got its messages out of order or twice")
    return {"us_per_message": round(cpu / count * 1e6, 2), "frames": frames, "writes": writes}


def same_user(batches: list[Batch]) -> int:
    """Messages whose sender is their recipient: one frame, not two."""
    return sum(e["o"]["from"] == e["o"]["to"] for b in batches for e in b.entries)


def main(clients: int = typer.Option(10_000), count: int = typer.Option(300_000),
         batch: int = typer.Option(100, help="entries per oplog batch"), rounds: int = typer.Option(3),
         senders_online: bool = typer.Option(False, help="the sender is a client too: two frames a message"),
         tcp: bool = typer.Option(False, help="real loopback TCP sockets; the loop thread's CPU"),
         counted: bool = typer.Option(False, "--callgrind", help="under callgrind: count the timed window only"),
         out: Path | None = typer.Option(None, help="write the result JSON here")) -> None:
    metrics.watch_gc()  # as the daemon runs: its GC callback is part of the cost
    runs = [uvloop.run(one_round(clients, count, batch, senders_online, tcp, counted)) for _ in range(rounds)]
    best = min(r["us_per_message"] for r in runs)
    result = {"clients": clients, "messages": count, "batch": batch, "senders_online": senders_online, "tcp": tcp,
              "rounds": [r["us_per_message"] for r in runs], "best_us_per_message": best,
              "frames": runs[0]["frames"], "writes": runs[0]["writes"] if not tcp else None,
              "writes_per_frame": None if tcp else round(runs[0]["writes"] / runs[0]["frames"], 3),
              "what": ("CPU of the event loop thread per message: Python and the write() calls on loopback TCP"
                       if tcp else "CPU of the daemon's Python per message, the socket write a no-op")
              + " (loadtest/hotpath.py)"}
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    if out:
        out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    typer.run(main)
