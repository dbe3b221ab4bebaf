"""FerretDB's own insert -> tail latency, measured beside ours in the same run.

Inserts a small document into `chat.probe` at a fixed rate and tails
local.oplog.rs for it with the daemon's own tailer (daemon/oplog.py), so the
figure is the database's share: insert call -> oplog entry in hand.
"""

from __future__ import annotations

import asyncio
import time

from daemon.oplog import RESTARTED, OplogTail
from db import mongo


async def measure(url: str, rate: float, seconds: float) -> list[float]:
    client = mongo.make_client(url, 5)
    sent: dict[int, float] = {}
    seen: list[float] = []
    tail = OplogTail(client, "chat.probe", await_ms=500)
    tail.last_ts = await tail.newest_ts()

    async def reader():
        async for batch in tail.batches():
            if batch is RESTARTED:
                continue
            now = time.perf_counter()
            for entry in batch:
                if entry.get("op") == "i" and entry["o"]["_id"] in sent:
                    seen.append(now - sent.pop(entry["o"]["_id"]))

    task = asyncio.create_task(reader())
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
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await coll.drop()
    await client.close()
    return seen


if __name__ == "__main__":
    import sys

    import orjson

    url, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    sys.stdout.buffer.write(orjson.dumps(asyncio.run(measure(url, rate, seconds))))
