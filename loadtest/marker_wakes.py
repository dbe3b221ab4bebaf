"""What a daemon routed by user pays for the relay's markers when many first sockets wait
for theirs at once, as after a restart: each user's first socket asks the relay for it and
waits (``daemon.stream.Stream.hold``) until the marker of its sub comes, and the relay
answers each sub with its own marker.

``--waiting`` first sockets (one user each) are held on a routed stream with a relay
client that only numbers the subs; then the markers come one per sub, oldest first, as
fast as the loop takes them, and each socket's wait ends at its own. Per marker: the loop's
CPU (the process's, one thread) from the first marker until every socket is served. No
database and no socket: the cost measured is the stream's and the interest's alone.

    .venv/bin/python -m loadtest.marker_wakes --waiting 1000,5000,20000

Run it from another checkout (``git worktree add``) to compare revisions: the figures are
per marker, so a cost that grows with the sockets waiting shows as a column that grows.
Writes var/bench/marker-wakes.json unless ``--out`` says where.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
import uvloop

from daemon.hub import Hub
from daemon.stream import Stream
from loadtest.common import machine
from loadtest.common.results import UNPUBLISHED
from oplog.events import Subscribed

app = typer.Typer(add_completion=False)
NAMESPACE = "chat.messages"


class NumberingRelay:
    """The daemon's relay client as a stream sees it: each sub numbered, nothing sent."""

    by_user = True
    namespace = NAMESPACE
    last_ts = None

    def __init__(self) -> None:
        self.subs = 0

    def want(self, namespace: str, user: str) -> int:
        self.subs += 1
        return self.subs

    def drop(self, namespace: str, user: str) -> None:
        pass


async def one(waiting: int) -> dict:
    relay = NumberingRelay()
    # No database is reached: nothing here reads the truth.
    stream = Stream(None, relay, Hub(1 << 20), retention_seconds=86400, cache_max=100,  # type: ignore[arg-type]
                    gap_check_seconds=1.0, relay=relay)  # type: ignore[arg-type]
    stream.consumer.start_at(0)
    holds = [asyncio.create_task(stream.hold(f"user{n}", 3600.0)) for n in range(waiting)]
    while relay.subs < waiting:  # every socket has asked and waits
        await asyncio.sleep(0)
    before = machine.own_cpu_seconds()
    for token in range(1, waiting + 1):
        stream.consumer._step(Subscribed(NAMESPACE, token), 0.0)
        await asyncio.sleep(0)  # the loop runs the sockets the marker woke, as between two relay frames
    served = await asyncio.gather(*holds)
    cpu = machine.own_cpu_seconds() - before
    if not all(served):
        raise SystemExit("a socket was not served by its marker")
    return {"waiting": waiting, "markers": waiting, "cpu_us_per_marker": round(cpu / waiting * 1e6, 2)}


@app.command()
def main(waiting: str = typer.Option("1000,5000,20000", help="first sockets waiting at once, per run"),
         out: Path = typer.Option(UNPUBLISHED / "marker-wakes.json")) -> None:
    runs = [uvloop.run(one(int(n))) for n in waiting.split(",")]
    for run in runs:
        print(f"{run['waiting']} first sockets waiting, a marker each: {run['cpu_us_per_marker']} us of CPU per marker")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**machine.describe(), "where": "one process, uvloop, no database or socket: a "
                               "routed stream's first sockets waiting for their relay markers, one marker per sub",
                               "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    app()
