"""What a restarted daemon's clients cost MySQL when they all come back at once, each first
socket with a catch-up of its user's last seconds (``StreamRanges.of_user``): one read per user,
as it was, against the users asked for meanwhile read together (``db.stream_ranges.one_read``).
On a real MariaDB: ``messages`` ids 1..span between ``users`` users; a burst of ``users``
catch-ups, each of its user's messages after id 0 (``since`` = the range's start), on a pool of
``threads`` connections, rounds alternated. Wall time of the burst, the client's CPU and
MariaDB's, and that each user got the same rows both ways.

    .venv/bin/python -m loadtest.catchup_reads --users 5000 --span 2000 --rounds 3

Writes loadtest/results/catchup-reads.json.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path

import psutil
import typer

from db.partition_map import tables_of
from db.sql import conversation_key, make_engine, metadata
from db.stream_ranges import StreamRanges
from harness.system import databases
from loadtest.common import machine
from loadtest.common.results import RESULTS

app = typer.Typer(add_completion=False)


def _fill(url: str, users: int, span: int) -> None:
    engine = make_engine(url, 30.0, pool_size=1)
    metadata.create_all(engine)
    at = datetime.datetime(2026, 1, 1)
    rows = [{"id": i, "sender": f"u{i % users}", "recipient": f"u{(i * 7 + 1) % users}",
             "conversation": conversation_key(f"u{i % users}", f"u{(i * 7 + 1) % users}"), "body": f"m{i}",
             "created_at": at} for i in range(1, span + 1)]
    with engine.begin() as conn:
        conn.execute(tables_of(0).messages.insert(), rows)
    engine.dispose()


async def _burst(url: str, users: int, span: int, threads: int, together: bool) -> tuple[float, float, list]:
    ranges = StreamRanges(make_engine(url, 30.0, pool_size=threads, reads_only=True))
    try:
        if together:
            def read(user: str) -> asyncio.Future:
                return asyncio.ensure_future(ranges.of_user(user, 0, span, 5000))
        else:  # one read per user, as every catch-up was
            def read(user: str) -> asyncio.Future:
                return ranges._threads.run(ranges._read, 0, span, 5000, user)
        cpu, wall = machine.own_cpu_seconds(), time.perf_counter()
        found = await asyncio.gather(*(read(f"u{n}") for n in range(users)))
        wall, cpu = time.perf_counter() - wall, machine.own_cpu_seconds() - cpu
        return wall, cpu, [[doc["_id"] for doc in docs] for docs in found]
    finally:
        ranges.close()


@app.command()
def main(users: int = typer.Option(5000, min=2), span: int = typer.Option(2000, min=1),
         threads: int = typer.Option(2, min=1), rounds: int = typer.Option(3, min=1),
         out: Path = typer.Option(RESULTS / "catchup-reads.json")) -> None:
    runs: dict[str, list[dict]] = {"one_read_each": [], "together": []}
    with databases(Path(tempfile.mkdtemp(prefix="catchup-reads-"))) as dbs:
        url = dbs.mariadb.url()
        _fill(url, users, span)
        assert dbs.mariadb.proc is not None
        server_proc = psutil.Process(dbs.mariadb.proc.pid)
        answers: dict[str, list] = {}
        for _ in range(rounds):
            for name in runs:
                server = machine.cpu_seconds([server_proc])
                wall, cpu, found = asyncio.run(_burst(url, users, span, threads, name == "together"))
                runs[name].append({"wall_s": round(wall, 3), "client_cpu_s": round(cpu, 3),
                                   "mariadb_cpu_s": round(machine.cpu_seconds([server_proc]) - server, 2)})
                answers.setdefault(name, found)
                print(f"{name}: {runs[name][-1]}")
    if answers["together"] != answers["one_read_each"]:
        raise SystemExit("the reads together did not answer what the reads alone did")
    median = {name: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]} for name, rs in runs.items()}
    result = {**machine.describe(), "users": users, "span": span, "threads": threads, "rounds": rounds,
              "where": f"one process, MariaDB on loopback: {users} catch-ups at once, each of one user's messages "
                       f"among {span} ids, on {threads} pooled connections; medians of the rounds",
              "per_burst": median, "rounds_raw": runs,
              "ratios": {k: round(median["together"][k] / median["one_read_each"][k], 3)
                         for k in median["together"] if median["one_read_each"][k]}}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"together / one read each: {result['ratios']}; wrote {out}")


if __name__ == "__main__":
    app()
