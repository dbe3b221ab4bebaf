"""A/B: where a daemon reads the ids its oplog tail skipped, under POST load.

`python -m loadtest.hole_fill`: the system as `make run` deploys it (2 API
processes, the writer process, 2 daemons tailing FerretDB), `ab -k` on
POST /v1/messages, once with ``CHAT_FILL_HOLES_FROM_MYSQL=true`` (MySQL by
primary key) and once with ``false`` (the `messages` collection, which
FerretDB 1.24 answers by decoding all of it), alternated on fresh databases.
A WebSocket client of the recipient checks that every stored message arrived
exactly once; a run that loses or repeats one fails. Figures are FerretDB's
(not MongoDB's): on MongoDB both reads use an index, and a tail rarely falls
off its hours of oplog.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import orjson
import typer
from sqlalchemy import create_engine, text

from chatctl.client import Inbox, listen
from loadtest.common import ab
from loadtest.common import machine
from loadtest.bench import DEPLOYED_APIS, log, post_body
from loadtest.common.results import RESULTS
from harness.system import System, databases, running_system

app = typer.Typer(add_completion=False)
RECIPIENT = "ab-reader"


def stored_ids(system: System) -> list[int]:
    engine = create_engine(system.env["CHAT_MYSQL_URL"])
    try:
        with engine.connect() as conn:
            return list(conn.execute(text("SELECT id FROM messages WHERE recipient = :r ORDER BY id"),
                                     {"r": RECIPIENT}).scalars())
    finally:
        engine.dispose()


def log_events(system: System, event: str) -> int:
    return sum(p.read_text(errors="replace").count(f"event={event}") for p in system.logdir.glob("daemon_*.log"))


def one_run(variant: str, concurrency: int, seconds: float, settle_seconds: float) -> dict:
    with databases(Path(tempfile.mkdtemp(prefix="bench-fill-"))) as dbs:
        with running_system(dbs, daemons=2, apis=DEPLOYED_APIS, writer=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                            CHAT_WRITER_QUEUE_MAX="50000",
                            CHAT_FILL_HOLES_FROM_MYSQL=str(variant == "mysql").lower()) as system:
            row = asyncio.run(measure(system, variant, concurrency, seconds, settle_seconds))
            row.update(fall_offs=log_events(system, "oplog_fell_off"),
                       fills_from_mysql=log_events(system, "stream_fill source=mysql"))
    log(f"  -> {orjson.dumps(row).decode()}")
    return row


async def measure(system: System, variant: str, concurrency: int, seconds: float, settle_seconds: float) -> dict:
    inbox = Inbox()
    listener = asyncio.create_task(listen(system.ws_url, system.token(RECIPIENT), None, lambda f: None,
                                          max_backoff=0.5, inbox=inbox))
    try:
        async with asyncio.timeout(10):
            while not inbox.hellos:
                await asyncio.sleep(0.05)
        ferretdb = machine.ProcessCpu([machine.pid_of(system.dbs.ferretdb.proc)])
        log(f"{variant}: ab POST -c {concurrency} -t {seconds}")
        result = await asyncio.to_thread(ab.run, f"{system.api_url}/v1/messages", concurrency, seconds,
                                         system.token("ab-writer"), post_body())
        ferretdb_cores = ferretdb.cores()
        ids = await asyncio.to_thread(stored_ids, system)
        started = time.monotonic()
        while set(ids) - inbox.seen and time.monotonic() - started < settle_seconds:
            await asyncio.sleep(0.1)
        caught_up = round(time.monotonic() - started, 2)
        await asyncio.sleep(0.5)  # and nothing more comes
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    return {"variant": variant, "concurrency": concurrency, "seconds": seconds,
            **{k: result[k] for k in ("complete", "rps", "p50_ms", "p99_ms", "max_ms", "errors")},
            "stored": len(ids), "lost": len(set(ids) - inbox.seen), "duplicated": inbox.duplicates,
            "caught_up_after_s": caught_up, "ferretdb_cores": ferretdb_cores, "command": result["command"]}


@app.command()
def main(pairs: int = typer.Option(2, help="A/B pairs, alternated"), concurrency: int = 100,
         seconds: float = 15, settle_seconds: float = 120, out: Path = RESULTS / "hole_fill.json") -> None:
    rows = []
    for i in range(pairs):
        for variant in (("mysql", "collection") if i % 2 == 0 else ("collection", "mysql")):
            rows.append(one_run(variant, concurrency, seconds, settle_seconds))
    result = {"machine": machine.describe(), "rows": rows,
              "what": "ab -k POST /v1/messages as deployed (2 APIs, writer, 2 daemons tailing FerretDB 1.24, "
                      "not MongoDB); holes read from MySQL against from the messages collection"}
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print("| variant | POST/s | p50 ms | p99 ms | max ms | errors | fall-offs | fills from MySQL "
          "| FerretDB cores | all delivered after s | lost | dup |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['rps']:.0f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_ms']:.0f} "
              f"| {r['errors']:.0f} | {r['fall_offs']} | {r['fills_from_mysql']} | {r['ferretdb_cores']} "
              f"| {r['caught_up_after_s']} | {r['lost']} | {r['duplicated']} |")
    bad = [r for r in rows if r["lost"] or r["duplicated"] or r["errors"]]
    if bad:
        raise SystemExit(f"FAILED: lost, duplicated or refused messages in {len(bad)} run(s)")
    print(f"wrote {out}")


if __name__ == "__main__":
    app()
