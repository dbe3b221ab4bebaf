"""What a daemon's hello pays to read the user's unread total from MySQL, per read, on a real
MariaDB: through a SQLAlchemy ``Connection`` (a ping, the SELECT, the ROLLBACK it sends on
close) against ``UnreadTotals``' one SELECT on a raw pooled connection of a ``reads_only``
engine (the SELECT alone: no ping, no rollback), both on a thread of their own as the daemon
runs them. Client CPU and wall time per read, rounds alternated.

    .venv/bin/python -m loadtest.unread_read --reads 3000 --rounds 3

Writes loadtest/results/unread-read.json.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import typer

from db.conversation_state import UnreadTotals, unread_by_peer
from db.sql import make_engine
from db.threads import Threads
from harness.system import databases
from loadtest.common import machine
from loadtest.common.results import RESULTS

app = typer.Typer(add_completion=False)


async def _connection_path(url: str, reads: int) -> tuple[float, float]:
    """The read as it was: on the same kind of thread as ``UnreadTotals``, through a ``Connection``."""
    engine, threads = make_engine(url, 5.0, pool_size=1), Threads(1, "unread")

    def run() -> int:
        with engine.connect() as conn:
            return sum(unread_by_peer(conn, 0, "reader").values())

    try:
        cpu, wall = machine.own_cpu_seconds(), time.perf_counter()
        for _ in range(reads):
            await asyncio.wait_for(threads.run(run), 5.0)
        return (machine.own_cpu_seconds() - cpu) / reads * 1e6, (time.perf_counter() - wall) / reads * 1e6
    finally:
        threads.close()
        engine.dispose()


async def _unread_totals(url: str, reads: int) -> tuple[float, float]:
    unread = UnreadTotals(make_engine(url, 5.0, pool_size=1, reads_only=True), threads=1)
    try:
        cpu, wall = machine.own_cpu_seconds(), time.perf_counter()
        for _ in range(reads):
            if await unread.total("reader", 0, 5.0) is None:
                raise SystemExit("a read was not answered")
        return (machine.own_cpu_seconds() - cpu) / reads * 1e6, (time.perf_counter() - wall) / reads * 1e6
    finally:
        unread.close()


@app.command()
def main(reads: int = typer.Option(3000, min=1), rounds: int = typer.Option(3, min=1),
         out: Path = typer.Option(RESULTS / "unread-read.json")) -> None:
    runs: dict[str, list[tuple[float, float]]] = {"connection": [], "unread_totals": []}
    with databases(Path(tempfile.mkdtemp(prefix="unread-read-"))) as dbs:
        for _ in range(rounds):
            runs["connection"].append(asyncio.run(_connection_path(dbs.mariadb.url(), reads)))
            runs["unread_totals"].append(asyncio.run(_unread_totals(dbs.mariadb.url(), reads)))
    median = {name: {"cpu_us": round(statistics.median(r[0] for r in rs), 1),
                     "wall_us": round(statistics.median(r[1] for r in rs), 1)} for name, rs in runs.items()}
    result = {**machine.describe(), "reads": reads, "rounds": rounds,
              "where": "one process reading one user's unread total from MariaDB on loopback, an empty table; "
                       "client CPU (the process's user + system time) and wall time per read, medians of the rounds",
              "per_read": median,
              "cpu_ratio": round(median["unread_totals"]["cpu_us"] / median["connection"]["cpu_us"], 2),
              "wall_ratio": round(median["unread_totals"]["wall_us"] / median["connection"]["wall_us"], 2),
              "rounds_raw": {name: [[round(c, 1), round(w, 1)] for c, w in rs] for name, rs in runs.items()}}
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, figures in median.items():
        print(f"{name}: {figures['cpu_us']} us CPU, {figures['wall_us']} us wall per read")
    print(f"UnreadTotals / Connection: CPU {result['cpu_ratio']}x, wall {result['wall_ratio']}x; wrote {out}")


if __name__ == "__main__":
    app()
