"""The relay's cost per oplog entry, with real daemons' sockets and no database.

The host's relay (relay/server.py) takes each batch its tail reads, encodes
each entry once, routes it by user and writes each daemon its frame. At the
peers benchmark's rates it is the feed's whole cost but the schedule's, and
one relay serves every daemon of a host, so its cost per entry bounds the
host's rate. This times that path alone: the real ``Relay`` fed
recorded-shaped oplog batches (decoded from BSON in the timed window, as
pymongo hands a getMore's batch to the tail), ``--daemons`` daemons
connected over its real Unix socket, each holding its share of
``--clients`` users (routed by user), read by threads of this process. The
time is the event loop thread's CPU alone (``time.thread_time``): the
relay's Python and its ``write()`` calls.

Each daemon's bytes are read back afterwards: every entry must reach the
daemons holding its recipient or its sender as the oplog had it, in order,
and every other daemon as its id and digest (``chat.messages.shown_digest``),
in order, or the run fails.

    python -m loadtest.relay_path                          # 200,000 entries, 2 daemons, 3 rounds
    python -m loadtest.relay_path --daemons 6 --out relay.json
"""

from __future__ import annotations

import asyncio
import random
import socket
import tempfile
import threading
import time
from datetime import UTC, datetime
from collections.abc import AsyncIterator
from pathlib import Path

import bson
import orjson
import typer
import uvloop
from bson import Timestamp
from bson.codec_options import CodecOptions

from chat.messages import shown_digest
from oplog.events import Batch, OplogEvent, Restarted
from relay.protocol import LENGTH, frame
from relay.routing import unpack_passed
from relay.server import Relay

NAMESPACE = "chat.messages"
CODEC: CodecOptions = CodecOptions()  # pymongo's default: naive datetimes, dict documents


def oplog_replies(clients: int, count: int, batch: int, seed: int = 7) -> list[bytes]:
    """Getmore-shaped batches as the relay's tail asks for them (the entry fields only), BSON-encoded.
    Each message goes to one of the ``clients`` users (``r0``...); one in ten comes from one of them
    too, the others from a sender with no connection (one frame per message, as the peers run)."""
    rng, now = random.Random(seed), datetime.now(UTC).replace(tzinfo=None)
    replies = []
    for start in range(0, count, batch):
        entries = [{"op": "i", "ns": NAMESPACE, "ts": Timestamp(1_700_000_000 + i // 1000, i % 1000 + 1), "o": {
            "_id": i + 1, "from": f"r{rng.randrange(clients)}" if i % 10 == 0 else f"x{i % 997}",
            "to": f"r{rng.randrange(clients)}", "body": f"{time.time():.6f} relayed {i}", "created_at": now,
            "client_msg_id": None}} for i in range(start, min(start + batch, count))]
        replies.append(bson.encode({"nextBatch": entries}))
    return replies


class RecordedTail:
    """An ``oplog.events.OplogSource`` on recorded replies: each decoded when the relay asks for it,
    the loop thread's CPU taken from the first to the relay's ask after the last."""

    namespace = NAMESPACE
    namespaces = (NAMESPACE,)

    def __init__(self, replies: list[bytes]):
        self.last_ts: Timestamp | None = None
        self._replies = replies
        self.go = asyncio.Event()
        self.done = asyncio.Event()
        self.cpu_seconds = 0.0

    async def newest_ts(self) -> Timestamp | None:
        return None

    async def batches(self) -> AsyncIterator[OplogEvent]:
        yield Restarted()
        await self.go.wait()
        started = time.thread_time()
        for reply in self._replies:
            entries = bson.decode(reply, codec_options=CODEC)["nextBatch"]
            self.last_ts = entries[-1]["ts"]
            yield Batch(entries)
            # The loop runs between two batches, as between two polls of a tail: what a
            # socket did not take at once is written here, inside the time taken.
            await asyncio.sleep(0)
        self.cpu_seconds = time.thread_time() - started
        self.done.set()
        await asyncio.Event().wait()


class DaemonEnd(threading.Thread):
    """One daemon's end of the relay's socket: its hello, then every byte until the relay closes."""

    def __init__(self, path: Path, users: list[str], name: str):
        """Connects and says its hello; returns once the relay has answered it, which
        it does as it subscribes the daemon (``Relay.serve``): from then on, every batch comes."""
        super().__init__(daemon=True, name=name)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.sock.sendall(frame({"since": None, "ns": [NAMESPACE], "users": {NAMESPACE: users}, "name": name}))
        self.chunks: list[bytes] = []
        while not self.chunks or len(got := b"".join(self.chunks)) < 4 or len(got) < LENGTH.unpack_from(got)[0]:
            if not (data := self.sock.recv(1 << 16)):
                raise SystemExit(f"relay_path: the relay closed {name}'s connection before its hello's answer")
            self.chunks.append(data)

    def run(self) -> None:
        while data := self.sock.recv(1 << 20):
            self.chunks.append(data)
        self.sock.close()

    def frames(self) -> list[dict]:
        data, at, frames = b"".join(self.chunks), 0, []
        while at < len(data):
            (n,) = LENGTH.unpack_from(data, at)
            frames.append(bson.decode(data[at:at + n], codec_options=CODEC))
            at += n
        return frames


def check(name: str, frames: list[dict], held: set[str], replies: list[bytes]) -> None:
    """Raises unless the batch frames a daemon holding ``held`` got carry every entry to or from its
    users, each as the oplog had it, and every other id with its digest, each in order."""
    entries = [e for reply in replies for e in bson.decode(reply, codec_options=CODEC)["nextBatch"]]
    got, passed = [], []
    for batch in frames:
        got += batch["b"]
        passed += unpack_passed(batch["p"])
    want = [e for e in entries if e["o"]["to"] in held or e["o"]["from"] in held]
    if got != want:
        raise SystemExit(f"relay_path: {name} got {len(got)} entries for its users against {len(want)}, "
                         "or not as the oplog had them, or out of order")
    sent = {e["o"]["_id"] for e in want}
    others = {e["o"]["_id"]: shown_digest(e["o"]) for e in entries if e["o"]["_id"] not in sent}
    if [i for i, _ in passed] != list(others) or any(others[i] != digest for i, digest in passed):
        raise SystemExit(f"relay_path: {name} was not passed every other id in order with its digest")


async def one_round(clients: int, count: int, batch: int, daemons: int) -> dict:
    replies = oplog_replies(clients, count, batch)
    tail = RecordedTail(replies)
    relay = Relay(tail, CODEC)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "relay.sock"
        server = await asyncio.start_unix_server(relay.serve, path=str(path))
        running = asyncio.create_task(relay.run())
        finished = asyncio.ensure_future(tail.done.wait())
        try:
            await relay.ready.wait()
            users = [[f"r{u}" for u in range(clients) if u % daemons == k] for k in range(daemons)]
            peers = [await asyncio.to_thread(DaemonEnd, path, users[k], f"d{k}") for k in range(daemons)]
            for peer in peers:
                peer.start()
            tail.go.set()
            await asyncio.wait([finished, running], return_when=asyncio.FIRST_COMPLETED)
            if running.done():  # the relay's loop ended before the last batch: its error is the run's
                running.result()
                raise SystemExit("relay_path: the relay stopped before the last batch")
        finally:
            relay.close()  # the daemons' ends read to the end of their streams
            server.close()
            for task in (running, finished):
                task.cancel()
            await asyncio.gather(running, finished, return_exceptions=True)
    for peer in peers:
        await asyncio.to_thread(peer.join)
    for k, peer in enumerate(peers):
        check(peer.name, peer.frames()[1:], set(users[k]), replies)  # after the hello's answer
    sent = sum(len(c) for peer in peers for c in peer.chunks)
    return {"us_per_entry": round(tail.cpu_seconds / count * 1e6, 3), "bytes_per_entry": round(sent / count, 1)}


def main(clients: int = typer.Option(10_000), count: int = typer.Option(200_000),
         batch: int = typer.Option(200, help="entries per oplog batch (20,000 msg/s in 10 ms batches)"),
         daemons: int = typer.Option(2, help="daemons routed by user, each holding its share of the clients"),
         rounds: int = typer.Option(3),
         out: Path | None = typer.Option(None, help="write the result JSON here")) -> None:
    runs = [uvloop.run(one_round(clients, count, batch, daemons)) for _ in range(rounds)]
    result = {"clients": clients, "entries": count, "batch": batch, "daemons": daemons,
              "rounds": [r["us_per_entry"] for r in runs], "best_us_per_entry": min(r["us_per_entry"] for r in runs),
              "bytes_to_daemons_per_entry": runs[0]["bytes_per_entry"],
              "what": "CPU of the relay's event loop thread per oplog entry: the batch's BSON decode, the "
                      "relay's encode, routing and frames, and its write() calls to the daemons' Unix sockets "
                      "(loadtest/relay_path.py)"}
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    if out:
        out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    typer.run(main)
