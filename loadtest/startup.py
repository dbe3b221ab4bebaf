"""How long a fresh daemon takes to serve, and how much memory it holds idle,
with a full store behind it.

`python -m loadtest.startup [--messages 50000]`: private MariaDB and FerretDB
holding ``messages`` messages (bodies of 120 characters), then daemon
processes started one after another, as supervisord restarts them. For each:
the seconds from its start to its first /healthz "ok" (it answers 503 until
its stream is ready), and its resident memory once idle.
The figures are FerretDB's (not MongoDB's): on FerretDB each read of
`messages` decodes the whole collection. Writes
`loadtest/results/startup-latest.json`.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import psutil
import typer
from sqlalchemy import text

from chat.messages import Message, now_ms
from db import mongo
from db.sql import make_engine
from loadtest.common import machine
from loadtest.bench import log
from loadtest.common.results import RESULTS
from harness.system import Databases, System, databases, running_system

app = typer.Typer(add_completion=False)
BODY = "a message of a typical length, in a chat between two people who talk about their day at some length" + "."


async def fill(dbs: Databases, count: int) -> None:
    """``count`` messages in both stores, as the writer leaves them."""
    created = now_ms()
    engine = make_engine(dbs.mariadb.url(), 60)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO messages (id, sender, recipient, conversation, body, created_at) "
                          "SELECT seq, CONCAT('u', seq % 1000), CONCAT('u', (seq + 1) % 1000), 'c', :body, :at "
                          f"FROM seq_1_to_{count}"), {"body": BODY, "at": created.replace(tzinfo=None)})
        conn.execute(text("UPDATE stream_state SET last_id = :n, mirrored_upto = :n"), {"n": count})
    engine.dispose()
    client = mongo.make_client(dbs.ferretdb.url, 60)
    for lo in range(1, count + 1, 10_000):
        await client.chat[mongo.MESSAGES].insert_many([
            Message(i, f"u{i % 1000}", f"u{(i + 1) % 1000}", BODY, created).to_doc()
            for i in range(lo, min(lo + 10_000, count + 1))])
    await mongo.advance_head(client.chat, count)
    await client.close()


def time_to_ready(system: System, name: str, timeout: float = 120) -> tuple[float, int]:
    """Starts daemon ``name``; (seconds until its own /healthz says ok, its pid)."""
    started = time.monotonic()
    proc = system.start(name, wait=False)
    url = f"http://127.0.0.1:{system.daemon_port}/healthz"
    while time.monotonic() - started < timeout:
        try:
            r = httpx.get(url, timeout=2, headers={"connection": "close"})
            if r.status_code == 200 and r.json()["status"] == "ok" and r.json()["pid"] == proc.pid:
                return time.monotonic() - started, proc.pid
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"{name} not ready after {timeout}s")


@app.command()
def main(messages: int = typer.Option(50_000, help="Messages in the store."),
         starts: int = typer.Option(3, help="Daemon starts to time."),
         out: Path = typer.Option(RESULTS / "startup-latest.json")) -> None:
    with databases(Path(tempfile.mkdtemp(prefix="bench-startup-"))) as dbs:
        asyncio.run(fill(dbs, messages))
        with running_system(dbs, daemons=0, apis=0) as system:
            runs = []
            for i in range(starts):
                seconds, pid = time_to_ready(system, f"daemon_{i}")
                time.sleep(1.0)  # idle: what it holds once its start-up work is done
                rss = psutil.Process(pid).memory_info().rss
                runs.append({"ready_seconds": round(seconds, 2), "idle_rss_mb": round(rss / 2**20, 1)})
                log(f"daemon {i}: ready in {seconds:.2f} s, idle RSS {rss / 2**20:.0f} MB")
                system.stop(f"daemon_{i}")
    result = {"what": "a fresh daemon's time to /healthz ok and its idle resident memory, with a full store",
              "machine": machine.describe(), "messages": messages, "runs": runs,
              "ready_seconds_median": statistics.median(r["ready_seconds"] for r in runs),
              "idle_rss_mb_median": statistics.median(r["idle_rss_mb"] for r in runs)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    log(f"ready in {result['ready_seconds_median']} s (median), idle RSS {result['idle_rss_mb_median']} MB -> {out}")


if __name__ == "__main__":
    app()
