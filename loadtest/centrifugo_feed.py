"""Centrifugo's feed in a peers run: the same schedule, messages and recipients
as our feed (``loadtest.feeder``), published from a separate process through
Centrifugo's server HTTP API, one batch request per 10 ms tick, as our feed
hands the relay one oplog batch per tick.

Each publication goes to the recipient's personal channel (``#p<k>``) with the
same fields our frames carry, and ``t``: the wall-clock time the batch was
made, before the HTTP hop. SIGUSR1 starts the schedule.

    python -m loadtest.centrifugo_feed --api http://127.0.0.1:PORT --api-key K --clients 10000 \\
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

from loadtest import centrifugo
from loadtest.feeder import TICK_SECONDS, ready, parse_steps, recipients, step_ranges, ticks


def publications(first: int, n: int, to: list[int], wall: float, created: str) -> list[dict]:
    """The batch's publish commands: message ids first .. first + n - 1."""
    return [{"publish": {"channel": f"#p{to[i - 1]}",
                         "data": {"id": i, "t": wall, "from": f"x{i % 997}", "to": f"p{to[i - 1]}",
                                  "body": f"{wall:.6f} feed", "created_at": created}}}
            for i in range(first, first + n)]


async def feed(api: str, api_key: str, clients: int, steps: list[tuple[float, float]], gap: float, out: Path) -> None:
    go = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, go.set)
    ready(out)
    ranges = step_ranges(steps)
    to = recipients(clients, ranges[-1][1])
    marks, errors = [], 0
    in_flight: set[asyncio.Task] = set()
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector, headers={"X-API-Key": api_key}) as session:

        async def post(body: bytes, n: int) -> None:
            nonlocal errors
            try:
                async with session.post(f"{api}/api/batch", data=body,
                                        headers={"Content-Type": "application/json"}) as resp:
                    reply = await resp.read()
                    errors += centrifugo.batch_errors(reply, n) if resp.status == 200 else n
            except aiohttp.ClientError:
                errors += n

        await go.wait()
        msg_id = 1
        for (rate, _), (first, last) in zip(steps, ranges, strict=True):
            start, behind = time.monotonic(), 0.0
            mark = {"rate": rate, "first": first, "last": last, "start": time.time()}
            for tick, n in enumerate(ticks(rate, last - first + 1)):
                delay = start + tick * TICK_SECONDS - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    behind = max(behind, -delay)
                wall = time.time()
                body = orjson.dumps({"commands": publications(msg_id, n, to, wall,
                                                              datetime.now(UTC).isoformat(timespec="milliseconds"))})
                msg_id += n
                # Requests overlap, as our feed's batches do on the relay's socket; 64 at most in flight.
                task = asyncio.create_task(post(body, n))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            offered = (last - first + 1) / max(time.monotonic() - start, 1e-9)
            await asyncio.gather(*in_flight)
            mark.update(end=time.time(), behind_ms=round(behind * 1000, 1), offered_per_s=round(offered, 1))
            marks.append(mark)
            await asyncio.sleep(gap)
    out.write_bytes(orjson.dumps({"steps": marks, "publish_errors": errors}))


def main(api: str = typer.Option(...), api_key: str = typer.Option(...), clients: int = typer.Option(10_000),
         steps: str = typer.Option("20000x5"), gap: float = typer.Option(3.0), out: Path = typer.Option(...)) -> None:
    uvloop.run(feed(api, api_key, clients, parse_steps(steps), gap, out))


if __name__ == "__main__":
    typer.run(main)
