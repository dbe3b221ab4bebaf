"""The Python share of a daemon's cost per message, with no socket.

The replay benchmark (loadtest/replay.py) measures a daemon whole: about
17 us of CPU per one-frame message, of which about 10 us is the socket
``write()`` (on loopback the kernel runs the receiver's TCP in that call).
This one times only what runs in Python for each message: ``Consumer.take``
(oplog entries -> documents -> sequencer -> encode -> cache -> hub ->
``Connection.send``) for replay-shaped oplog entries, with
10,000 live connections whose transports only count what they are given.
No database, no network, one process: quick to rerun after a change to the
hot path, and steadier than the replay on a noisy machine.

    python -m loadtest.hotpath                # 300,000 messages, 3 rounds
    python -m loadtest.hotpath --out hotpath.json
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import orjson
import typer

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
    """What a live connection writes to: counts frames, never backs up."""

    __slots__ = ("frames",)

    def __init__(self) -> None:
        super().__init__()
        self.frames = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.frames += 1

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


def oplog_batches(clients: int, count: int, batch: int, seed: int = 7) -> list[Batch]:
    """Insert entries as FerretDB writes them, one recipient per message (the
    sender offline: one frame each, the replay's --senders-offline)."""
    rng, now = random.Random(seed), datetime.now(UTC)
    return [Batch([{"op": "i", "ns": NAMESPACE, "o": {
        "_id": i + 1, "from": f"x{rng.randrange(clients)}", "to": f"r{rng.randrange(clients)}",
        "body": f"{time.time():.6f} replay", "created_at": now, "client_msg_id": None}}
        for i in range(start, min(start + batch, count))]) for start in range(0, count, batch)]


async def one_round(clients: int, count: int, batch: int) -> dict:
    settings = Settings()
    hub = Hub(settings.daemon.send_buffer_max_bytes)
    state, handler = ServerState(settings), Unrouted()
    transports = []
    for i in range(clients):
        conn = Connection(state, handler)
        transport = CountingTransport()
        conn.transport, conn.http = transport, None
        conn.subscriber = Subscriber(conn, f"r{i}")
        conn.subscriber.pending = None  # live
        transports.append(transport)
        hub.register(conn.subscriber)
    # No database: only a catch-up reads it, and every connection here is live from the start.
    stream = Stream(None, SimpleNamespace(namespace=NAMESPACE), hub,  # type: ignore[arg-type]
                    retention_seconds=settings.stores.retention_seconds,
                    cache_max=settings.daemon.recent_cache_max, gap_check_seconds=3600,
                    cache_max_bytes=settings.daemon.recent_cache_max_bytes)
    batches = oplog_batches(clients, count, batch)
    gc.collect()
    cpu = time.process_time()
    for oplog_batch in batches:
        stream.consumer.take(oplog_batch, time.perf_counter())  # what Consumer.run does with each oplog batch
    cpu = time.process_time() - cpu
    frames = sum(t.frames for t in transports)
    if stream.position != count or frames != count:
        raise SystemExit(f"hotpath: released {stream.position} and wrote {frames} of {count}")
    return {"us_per_message": round(cpu / count * 1e6, 2), "frames": frames}


def main(clients: int = typer.Option(10_000), count: int = typer.Option(300_000),
         batch: int = typer.Option(100, help="entries per oplog batch"), rounds: int = typer.Option(3),
         out: Path | None = typer.Option(None, help="write the result JSON here")) -> None:
    metrics.watch_gc()  # as the daemon runs: its GC callback is part of the cost
    runs = [asyncio.run(one_round(clients, count, batch)) for _ in range(rounds)]
    best = min(r["us_per_message"] for r in runs)
    result = {"clients": clients, "messages": count, "batch": batch, "rounds": [r["us_per_message"] for r in runs],
              "best_us_per_message": best,
              "what": "CPU of the daemon's Python per one-frame message, no socket write (loadtest/hotpath.py)"}
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    if out:
        out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    typer.run(main)
