"""Centrifugo's feed in a peers run: the same schedule, messages and recipients
as our feed (``loadtest.peers.feeder``), published from a separate process through
Centrifugo's server HTTP API, in batch requests of what each 10 ms tick made
(of several ticks while the previous request is answered: one request at a
time, so publications reach it in id order), as our feed hands the relay one
oplog batch per tick.

Each publication goes to the recipient's personal channel (``#p<k>``) with the
same fields our frames carry, and ``t``: the wall-clock time the batch was
made, before the HTTP hop. SIGUSR1 starts the schedule.

    python -m loadtest.peers.centrifugo_feed --api http://127.0.0.1:PORT --api-key K --clients 10000 \\
        --steps 20000x5,40000x5 --gap 3 --out feed.json
"""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson
import typer
import uvloop

from loadtest.clients import centrifugo
from loadtest.peers.feeder import parse_steps, ready, recipients, schedule, step_ranges, take_all


def publications(first: int, n: int, to: list[int], wall: float, created: str) -> list[dict]:
    """The batch's publish commands: message ids first .. first + n - 1."""
    return [{"publish": {"channel": f"#p{to[i - 1]}",
                         "data": {"id": i, "t": wall, "from": f"x{i % 997}", "to": f"p{to[i - 1]}",
                                  "body": f"{wall:.6f} feed", "created_at": created}}}
            for i in range(first, first + n)]


async def feed(api: str, api_key: str, clients: int, steps: list[tuple[float, float]], gap: float, out: Path) -> None:
    """Ticks make batches on the schedule's clock; one sender posts whatever has queued since its
    last request as the next request, one at a time, so publications reach Centrifugo in id
    order (our relay hands over batches in order too) and a slow answer groups the next ticks
    into one request instead of slowing the schedule down."""
    go = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, go.set)
    ready(out)
    ranges = step_ranges(steps)
    to = recipients(clients, ranges[-1][1])
    marks: list[dict] = []
    made: asyncio.Queue[list[dict] | None] = asyncio.Queue()
    counts = {"errors": 0, "requests": 0}

    async def send(session: aiohttp.ClientSession) -> None:
        done = False
        while not done:
            commands, done = await take_all(made)
            flat = [c for batch in commands for c in batch]
            if not flat:
                continue
            counts["requests"] += 1
            try:
                async with session.post(f"{api}/api/batch", data=orjson.dumps({"commands": flat}),
                                        headers={"Content-Type": "application/json"}) as resp:
                    reply = await resp.read()
                    counts["errors"] += centrifugo.batch_errors(reply, len(flat)) if resp.status == 200 else len(flat)
            except aiohttp.ClientError:
                counts["errors"] += len(flat)

    async with aiohttp.ClientSession(headers={"X-API-Key": api_key}) as session:
        sender = asyncio.create_task(send(session))
        await go.wait()
        async for first, n in schedule(steps, gap, marks):
            wall = time.time()
            made.put_nowait(publications(first, n, to, wall, datetime.now(UTC).isoformat(timespec="milliseconds")))
        made.put_nowait(None)
        await sender
    out.write_bytes(orjson.dumps({"steps": marks, "publish_errors": counts["errors"],
                                  "publish_requests": counts["requests"]}))


def main(api: str = typer.Option(...), api_key: str = typer.Option(...), clients: int = typer.Option(10_000),
         steps: str = typer.Option("20000x5"), gap: float = typer.Option(3.0), out: Path = typer.Option(...)) -> None:
    uvloop.run(feed(api, api_key, clients, parse_steps(steps), gap, out))


if __name__ == "__main__":
    typer.run(main)
