"""How long a host's clients take to be back after all its daemons restart.

`python -m loadtest.restart_reconnect [--clients 5000]`: private MariaDB and
FerretDB holding ``messages`` messages, two daemons, ``clients`` lean
WebSocket clients (one user each) from this process. Then both daemons get
SIGTERM (they close every client with 1012) and start again, as
`supervisorctl restart daemon:*` does; each client reconnects with `since`
after a jittered backoff (0.1 s doubling to 2 s, as the reference client),
and the run measures the seconds from the SIGTERM until every client has its
hello again. FerretDB's figures, not MongoDB's. Writes
`loadtest/results/restart-reconnect-latest.json`.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path

import orjson
import typer

from chatctl.client import Inbox
from loadtest.common import machine
from loadtest.bench import log
from loadtest.common.results import RESULTS
from loadtest.clients.lean import connect
from loadtest.startup import fill
from harness.system import System, databases, running_system

app = typer.Typer(add_completion=False)


class ReconnectTally:
    """When each client got its hello back after the restart."""

    def __init__(self, clients: int):
        self.connected = [asyncio.Event() for _ in range(clients)]
        self.restarted_at: float | None = None
        self.back_at: dict[int, float] = {}  # client -> its first hello after the restart


async def keep_connected(system: System, i: int, tally: ReconnectTally) -> None:
    """One client: connected, and reconnected with `since` whenever it is closed."""
    inbox, token = Inbox(), system.token(f"r{i}")
    delay = 0.1
    while True:
        try:
            client = await connect("127.0.0.1", system.daemon_port, token, inbox, lambda doc, at: None)
        except (ConnectionError, OSError):
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(2.0, delay * 2)
            continue
        delay = 0.1
        if tally.restarted_at is not None:
            tally.back_at.setdefault(i, time.monotonic())
        tally.connected[i].set()
        await client.lost
        await asyncio.sleep(random.uniform(0.0, 0.5))  # a client's jitter before the first retry


async def measure(system: System, clients: int) -> dict:
    tally = ReconnectTally(clients)
    started = time.monotonic()
    tasks = [asyncio.create_task(keep_connected(system, i, tally)) for i in range(clients)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in tally.connected)), 300)
    connect_seconds = time.monotonic() - started
    log(f"{clients} clients connected in {connect_seconds:.1f} s")
    tally.restarted_at = time.monotonic()
    await asyncio.to_thread(restart_all, system)
    deadline = time.monotonic() + 300
    while len(tally.back_at) < clients and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    back = len(tally.back_at)
    all_back = max(tally.back_at.values()) - tally.restarted_at if back >= clients else None
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"clients": clients, "connect_seconds": round(connect_seconds, 1), "reconnected": back,
            "all_back_seconds": round(all_back, 1) if all_back is not None else None}


def restart_all(system: System) -> None:
    """SIGTERM to every daemon, wait for each to exit, then start them again."""
    names = sorted(n for n in system.procs if n.startswith("daemon"))
    for name in names:
        system.procs[name].terminate()
    for name in names:
        system.stop(name)  # waits for the exit
    for name in names:
        system.start(name, wait=False)


@app.command()
def main(clients: int = typer.Option(5000, help="WebSocket clients, one user each."),
         messages: int = typer.Option(50_000, help="Messages in the store."),
         out: Path = typer.Option(RESULTS / "restart-reconnect-latest.json")) -> None:
    with databases(Path(tempfile.mkdtemp(prefix="bench-reconnect-"))) as dbs:
        asyncio.run(fill(dbs, messages))
        with running_system(dbs, daemons=2, apis=0) as system:
            row = asyncio.run(measure(system, clients))
    result = {"what": "seconds from SIGTERM to both daemons until every client has its hello again",
              "machine": machine.describe(), "messages": messages, **row}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    log(f"{row['reconnected']} of {clients} back in {row['all_back_seconds']} s -> {out}")


if __name__ == "__main__":
    app()
