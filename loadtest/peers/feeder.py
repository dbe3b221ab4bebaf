"""The daemons' feed as production has it, for benchmarks past FerretDB's ceiling.

A separate process runs the host's real relay (``relay.server.Relay``) on its
Unix socket, and real daemon processes connect to it as to any relay
(``CHAT_OPLOG_RELAY_SOCKET``). In place of the oplog tail, the relay reads a
schedule: steps of a set rate for a set time, in oplog batches of what 10 ms
of traffic brings. Each message is first committed to MySQL (partition 0's
`messages` table, as the writer commits it) and then handed to the relay, so
the system's truth is real: whatever a daemon sheds under overload is read
back from MySQL, as in production. What is left out is FerretDB: its
insert → oplog tail (about 24k inserts/s here) would cap every run, and a
real MongoDB replica set would not.

Each message's body starts with the wall-clock time at which its batch was
made, before the MySQL commit and the relay's hop: the latency clients
measure is the whole path from "the writer has the batch" to the socket.
Message i (from 1) goes to recipient ``recipients(clients, count)[i - 1]``;
senders are users with no connection, so each message is one frame, the unit
of published figures (a publication to one user's channel).

    python -m loadtest.peers.feeder --socket S --mysql-url U --mongo-db chat --clients 10000 \\
        --steps 20000x5,40000x5 --gap 3 --entries entries.bson --out feed.json
    (SIGUSR1 starts the schedule)
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import bson
import orjson
import typer
import uvloop
from bson import Timestamp
from bson.codec_options import CodecOptions

from chat.unix_socket import bind_owner_only
from db.sql import conversation_key
from oplog.events import Batch, OplogEvent, Restarted
from relay.server import Relay

if TYPE_CHECKING:
    from MySQLdb.connections import Connection

TICK_SECONDS = 0.01  # FerretDB re-checks a tail every 10 ms; MongoDB's getMore batches are of that order
INSERT = ("INSERT INTO messages (id, sender, recipient, conversation, body, client_msg_id, created_at) "
          "VALUES (%s, %s, %s, %s, %s, NULL, %s)")


def parse_steps(text: str) -> list[tuple[float, float]]:
    """``"20000x5,40000x5"`` -> [(20000.0, 5.0), (40000.0, 5.0)]: (messages/s, seconds) per step."""
    steps = []
    for part in text.split(","):
        rate, _, seconds = part.strip().partition("x")
        if not seconds or float(rate) <= 0 or float(seconds) <= 0:
            raise ValueError(f"a step is RATExSECONDS with both positive, got {part!r}")
        steps.append((float(rate), float(seconds)))
    return steps


def step_ranges(steps: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """The message ids (first, last) of each step; ids run from 1 without a gap."""
    ranges, first = [], 1
    for rate, seconds in steps:
        n = int(rate * seconds)
        ranges.append((first, first + n - 1))
        first += n
    return ranges


def recipients(clients: int, count: int, seed: int = 11) -> list[int]:
    """Who gets message i + 1: the same list in every process (the feeders and the check)."""
    rng = random.Random(seed)
    return [rng.randrange(clients) for _ in range(count)]


def ticks(rate: float, count: int) -> Iterator[int]:
    """Message counts per tick of ``TICK_SECONDS`` for ``count`` messages at ``rate``/s."""
    per_tick = max(1, round(rate * TICK_SECONDS))
    while count > 0:
        n = min(per_tick, count)
        count -= n
        yield n


async def schedule(steps: list[tuple[float, float]], gap: float, marks: list[dict]) -> AsyncIterator[tuple[int, int]]:
    """(first id, count) of each tick's batch, on the schedule's own clock; each step's mark (when
    it ran, how late the feed ran, the rate it offered) goes to ``marks``; ``gap`` s between steps."""
    for (rate, _), (first, last) in zip(steps, step_ranges(steps), strict=True):
        start, behind, msg_id = time.monotonic(), 0.0, first
        mark = {"rate": rate, "first": first, "last": last, "start": time.time()}
        for tick, n in enumerate(ticks(rate, last - first + 1)):
            delay = start + tick * TICK_SECONDS - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                behind = max(behind, -delay)
                await asyncio.sleep(0)  # whoever sends the batches sends what it was given
            yield msg_id, n
            msg_id += n
        mark.update(end=time.time(), behind_ms=round(behind * 1000, 1),
                    offered_per_s=round((last - first + 1) / max(time.monotonic() - start, 1e-9), 1))
        marks.append(mark)
        await asyncio.sleep(gap)


async def take_all(queue: asyncio.Queue) -> tuple[list, bool]:
    """Everything queued (waiting for the first), and whether the end (a None) came: a sender that
    was busy takes what the ticks made meanwhile as one group, as the writer's group commit does."""
    items = [await queue.get()]
    while not queue.empty():
        items.append(queue.get_nowait())
    if items[-1] is None:
        return items[:-1], True
    return items, False


class ScheduledFeed:
    """An ``oplog.events.OplogSource``: the schedule's messages as oplog batches, each committed to MySQL first."""

    def __init__(self, entries: list[dict], namespace: str, clients: int, steps: list[tuple[float, float]],
                 gap_seconds: float, mysql_url: str | None, prefix: str = "p"):
        self.namespace = namespace
        self.last_ts: Timestamp | None = None
        self._entries = entries
        self._steps, self._gap = steps, gap_seconds
        self._to = recipients(clients, sum(b - a + 1 for a, b in step_ranges(steps)))
        self._prefix = prefix
        self._mysql_url = mysql_url
        self.go = asyncio.Event()
        self.marks: list[dict] = []  # per step: when it started and ended (wall clock), and how late the feed ran
        self.insert_seconds = 0.0
        self.commits = 0
        self.finished = False

    async def newest_ts(self) -> Timestamp | None:
        return None

    @staticmethod
    def _connect(mysql_url: str) -> Connection:
        import MySQLdb  # mysqlclient, as the project's SQLAlchemy URLs use

        from sqlalchemy.engine import make_url
        url = make_url(mysql_url)
        return MySQLdb.connect(user=url.username or "root", passwd=url.password or "", db=url.database,
                               unix_socket=url.query.get("unix_socket"), host=url.host or "localhost",
                               port=url.port or 3306, autocommit=False)

    async def batches(self) -> AsyncIterator[OplogEvent]:
        """The schedule's batches, each once MySQL has committed it. Making batches
        runs on its own clock; commits take whatever has queued since the last
        one, in one transaction, as the writer's group commit does, so a slow
        commit delays delivery but never the schedule."""
        made: asyncio.Queue[list[dict] | None] = asyncio.Queue()
        ready: asyncio.Queue[list[dict]] = asyncio.Queue()
        yield Restarted()
        await self.go.wait()
        tasks = [asyncio.create_task(self._make(made)), asyncio.create_task(self._commit(made, ready))]
        try:
            while True:
                batch = await ready.get()
                self.last_ts = batch[-1]["ts"]
                yield Batch(batch)
        finally:
            for t in tasks:
                t.cancel()

    async def _make(self, made: asyncio.Queue) -> None:
        seconds = int(time.time())
        async for first, n in schedule(self._steps, self._gap, self.marks):
            wall, now = time.time(), datetime.now(UTC).replace(tzinfo=None)  # as pymongo decodes a date: naive, UTC
            seconds = max(seconds, int(wall))
            batch = []
            for msg_id in range(first, first + n):
                doc = {**self._entries[msg_id % len(self._entries)]["o"], "_id": msg_id,
                       "from": f"x{msg_id % 997}", "to": f"{self._prefix}{self._to[msg_id - 1]}",
                       "body": f"{wall:.6f} feed", "created_at": now}
                # As the relay's tail reads an entry: its projection (oplog.tail.ENTRY_PROJECTION)
                # leaves the server's other fields (_id, wall, ...) out of the reply.
                batch.append({"op": "i", "ns": self.namespace, "o": doc, "ts": Timestamp(seconds, msg_id % 2**31)})
            made.put_nowait(batch)
        made.put_nowait(None)

    async def _commit(self, made: asyncio.Queue, ready: asyncio.Queue) -> None:
        conn = self._connect(self._mysql_url) if self._mysql_url else None
        done = False
        while not done:
            group, done = await take_all(made)
            if conn is not None and group:
                rows = [(d["_id"], d["from"], d["to"], conversation_key(d["from"], d["to"]), d["body"],
                         d["created_at"].replace(tzinfo=None)) for batch in group for d in (e["o"] for e in batch)]
                began = time.perf_counter()
                await asyncio.to_thread(_insert, conn, rows)
                self.insert_seconds += time.perf_counter() - began
                self.commits += 1
            for batch in group:
                ready.put_nowait(batch)
        if conn is not None:
            conn.close()
        self.finished = True


def _insert(conn: Connection, rows: list[tuple]) -> None:
    with conn.cursor() as cur:
        cur.executemany(INSERT, rows)
    conn.commit()


async def serve(socket_path: Path, feed: ScheduledFeed, out: Path, subscribers: int = 1) -> None:
    relay = Relay(feed, CodecOptions(tz_aware=False))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, feed.go.set)
    server = await asyncio.start_unix_server(relay.serve, sock=bind_owner_only(socket_path, "feeder"))
    while relay.subscribers < subscribers:  # a batch made before a daemon listens would miss it
        await asyncio.sleep(0.05)
    ready(out)
    tailing = asyncio.create_task(relay.run())
    try:
        while not stop.is_set() and not tailing.done():
            await asyncio.sleep(0.1)
            if feed.finished and not out.exists():
                out.write_bytes(orjson.dumps({"steps": feed.marks, "mysql_commits": feed.commits,
                                              "mysql_commit_seconds": round(feed.insert_seconds, 2)}))
    finally:
        server.close()
        relay.close()
        tailing.cancel()
        await asyncio.gather(tailing, return_exceptions=True)
        socket_path.unlink(missing_ok=True)
    if tailing.done() and not tailing.cancelled() and (failed := tailing.exception()) is not None:
        raise failed


def ready(out: Path) -> None:
    """Tells the driver that SIGUSR1 is handled now (before, it would end the process)."""
    out.with_suffix(".ready").touch()


def main(socket: Path = typer.Option(...), entries: Path = typer.Option(..., help="recorded oplog entries (BSON)"),
         mongo_db: str = typer.Option("chat"), mysql_url: str = typer.Option("", help="empty: no MySQL commit"),
         clients: int = typer.Option(10_000), steps: str = typer.Option("20000x5"),
         gap: float = typer.Option(3.0, help="seconds between steps"), out: Path = typer.Option(...),
         subscribers: int = typer.Option(1, help="daemons to wait for before the schedule may start")) -> None:
    recorded = bson.decode_all(entries.read_bytes())
    feed = ScheduledFeed(recorded, f"{mongo_db}.messages", clients, parse_steps(steps), gap, mysql_url or None)
    uvloop.run(serve(socket, feed, out, subscribers))


if __name__ == "__main__":
    typer.run(main)
