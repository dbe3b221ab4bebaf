"""FerretDB's own insert -> tail latency, measured beside ours in the same run.

Inserts a small document into `chat.probe` at a fixed rate and tails
local.oplog.rs for it with the daemon's own tailer (oplog/tail.py), so the
figure is the database's share: insert call -> oplog entry in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

from pymongo import AsyncMongoClient

from db import mongo
from oplog.events import Batch
from oplog.tail import OplogTail


async def measure(url: str, rate: float, seconds: float) -> list[float]:
    client = mongo.make_client(url, 5)
    seen: list[float] = []
    try:
        # Bounded as a whole: a probe that cannot finish (FerretDB wedged
        # under load) returns what it saw rather than hold up the benchmark.
        async with asyncio.timeout(seconds + 30):
            await _probe(client, rate, seconds, seen)
    except TimeoutError:
        print(f"probe: gave up after {seconds + 30:g} s with {len(seen)} samples", file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 5)
    return seen


async def _probe(client: AsyncMongoClient, rate: float, seconds: float, seen: list[float]) -> None:
    sent: dict[int, float] = {}
    tail = OplogTail(client, "chat.probe", await_ms=500)
    tail.last_ts = await tail.newest_ts()

    async def reader() -> None:
        async for event in tail.batches():
            if not isinstance(event, Batch):
                continue
            now = time.perf_counter()
            for entry in event.entries:
                if entry.get("op") == "i" and entry["o"]["_id"] in sent:
                    seen.append(now - sent.pop(entry["o"]["_id"]))

    task = asyncio.create_task(reader())
    try:
        await asyncio.sleep(0.5)
        coll = client["chat"]["probe"]
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            i += 1
            sent[i + int(start * 1000) * 1000] = time.perf_counter()
            await coll.insert_one({"_id": i + int(start * 1000) * 1000})
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        await asyncio.sleep(1.0)
    finally:
        task.cancel()
        ended, = await asyncio.gather(task, return_exceptions=True)
        if not isinstance(ended, asyncio.CancelledError | None):
            # said, not swallowed: a tail that died leaves the run with no samples
            print(f"probe: the tail stopped early: {ended!r}", file=sys.stderr)
    await client["chat"]["probe"].drop()


if __name__ == "__main__":
    import orjson

    url, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    sys.stdout.buffer.write(orjson.dumps(asyncio.run(measure(url, rate, seconds))))
