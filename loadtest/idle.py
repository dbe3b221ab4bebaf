"""What an idle stack costs, and how fast the first message after a quiet spell arrives.

`python -m loadtest.idle [--quick] [--publish]`: a private MariaDB, FerretDB
and Redis, and the system as `make run` deploys it (the writer, the relay, two
API processes, two daemons, the pusher, which idles without a gateway), one
WebSocket client connected. Then, on the same system:

- **warm-up**: 250 messages, more than FerretDB's oplog keeps (200), so that
  it is full, as on a stack that has run a while (each FerretDB poll reads all of it);
- **idle**: nothing is sent for ``--idle`` seconds (60; quick: 20), then the
  CPU time of every process (ours, and mariadbd, ferretdb and redis-server,
  with their children) is sampled over ``--sample`` seconds (30; quick: 10),
  from /proc through psutil: the cores each kept busy doing nothing;
- **after idle**: one message is posted and its delivery timed (POST sent ->
  frame on the client's socket): the first after the idle minute, then
  ``--rounds`` more, each after ``--gap`` seconds of quiet;
- **traffic**: messages at ``--rate`` msg/s (10) for ``--traffic`` seconds
  (10), each timed the same way: the latency the idle ones compare with.

The goal it checks (printed, not a failure): the idle stack under 0.05 of a
core in all, and the median first message after idle within 50 ms of the
median under traffic. A message not delivered fails the run.

Writes var/bench/idle.json, or with ``--publish`` loadtest/results/idle-latest.json
and the generated section of docs/benchmarks.md ("An idle stack"). FerretDB
1.24's figures, not MongoDB's: on MongoDB the tail waits on the server (awaitData).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import orjson
import psutil
import typer
import websockets

from loadtest.common import machine
from loadtest.common.results import RESULTS, UNPUBLISHED
from loadtest.report.idle_table import idle_table
from loadtest.report.write import write_result

if TYPE_CHECKING:
    from harness.system import Databases, System

OUT_DEFAULT = UNPUBLISHED / "idle.json"
OUT_PUBLISHED = RESULTS / "idle-latest.json"
GOAL_CORES = 0.05  # the idle stack, all processes
GOAL_LATENCY_MS = 50.0  # first message after idle, against the same under traffic (medians)
# Messages before the quiet: more than the entries FerretDB's oplog keeps (CHAT_OPLOG_MAX_DOCS, 100), so
# that it is full, as on a stack that has run for a while: each FerretDB poll reads the whole of it.
WARM_UP = 250
WARM_UP_AT_ONCE = 10
SENDERS = 4


def processes(system: System, dbs: Databases) -> dict[str, psutil.Process]:
    """Every process of the stack by name: ours, then the databases."""
    procs = {name: psutil.Process(p.pid) for name, p in system.procs.items()}
    for name, server in (("mariadbd", dbs.mariadb), ("ferretdb", dbs.ferretdb), ("redis-server", dbs.redis)):
        if server is not None:
            procs[name] = psutil.Process(machine.pid_of(server.proc))
    return procs


def _cpu(proc: psutil.Process) -> float:
    """CPU seconds of a process and its live children (a script that execs its server)."""
    return machine.cpu_seconds([proc, *proc.children(recursive=True)])


def sample_cpu(procs: dict[str, psutil.Process], seconds: float) -> dict[str, float]:
    """Cores each process kept busy over ``seconds``."""
    start = {name: _cpu(p) for name, p in procs.items()}
    began = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - began
    return {name: round((_cpu(p) - start[name]) / elapsed, 4) for name, p in procs.items()}


class Receiver:
    """One WebSocket client; ``arrived(body)`` returns when a message with that body is on its socket."""

    def __init__(self, system: System, user: str) -> None:
        self.system, self.user = system, user
        self._waiting: dict[str, asyncio.Future[float]] = {}
        self.received = 0

    async def run(self, ready: asyncio.Event) -> None:
        url = f"{self.system.ws_url}/v1/ws"
        headers = {"Authorization": f"Bearer {self.system.token(self.user)}"}
        async with websockets.connect(url, additional_headers=headers, max_queue=None) as ws:
            ready.set()
            async for raw in ws:
                now = time.perf_counter()
                frame = orjson.loads(raw)
                if frame.get("type") == "message":
                    self.received += 1
                    waiter = self._waiting.pop(frame.get("body", ""), None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(now)

    def expect(self, body: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting[body] = future
        return future


async def timed_message(system: System, http: httpx.AsyncClient, receiver: Receiver, sender: str,
                        limit: float = 30.0) -> float | None:
    """Delivery of one message in ms (POST sent -> frame received), None if it never came within ``limit``."""
    body = f"idle {uuid.uuid4().hex}"
    arrived = receiver.expect(body)
    sent = time.perf_counter()
    r = await http.post(f"{system.api_url}/v1/messages", json={"to": receiver.user, "body": body},
                        headers={"Authorization": f"Bearer {system.token(sender)}"})
    if r.status_code != 201:
        print(f"[idle] POST refused: {r.status_code} {r.text[:200]}", flush=True)
        return None
    try:
        return round((await asyncio.wait_for(arrived, limit) - sent) * 1000, 1)
    except TimeoutError:
        return None


def _summary(values: list[float]) -> dict:
    values = sorted(values)
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": len(values), "p50": round(statistics.median(values), 1),
            "p99": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1), "max": values[-1]}


async def measure(system: System, dbs: Databases, idle: float, sample: float, rounds: int, gap: float,
                  rate: float, traffic: float) -> dict:
    receiver = Receiver(system, "idle-receiver")
    ready = asyncio.Event()
    listening = asyncio.create_task(receiver.run(ready))
    await asyncio.wait_for(ready.wait(), 30)
    senders = [f"idle-sender-{i}" for i in range(SENDERS)]
    lost = 0
    async with httpx.AsyncClient(timeout=30) as http:
        for start in range(0, WARM_UP, WARM_UP_AT_ONCE):
            done = await asyncio.gather(*(timed_message(system, http, receiver, senders[i % SENDERS])
                                          for i in range(start, min(WARM_UP, start + WARM_UP_AT_ONCE))))
            lost += sum(1 for x in done if x is None)
        procs = processes(system, dbs)
        print(f"[idle] idling {idle:g} s, then sampling {sample:g} s of CPU", flush=True)
        await asyncio.sleep(idle)
        host = machine.CpuWindow()
        cores = await asyncio.to_thread(sample_cpu, procs, sample)
        host_cpu = host.result()
        first = await timed_message(system, http, receiver, senders[0])
        after_idle = [first]
        for i in range(rounds):
            await asyncio.sleep(gap)
            after_idle.append(await timed_message(system, http, receiver, senders[i % SENDERS]))
        print(f"[idle] traffic: {rate:g} msg/s for {traffic:g} s", flush=True)
        pending = []
        began = time.monotonic()
        for i in range(int(rate * traffic)):
            await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
            pending.append(asyncio.create_task(timed_message(system, http, receiver, senders[i % SENDERS])))
        under_traffic = await asyncio.gather(*pending)
    listening.cancel()
    await asyncio.gather(listening, return_exceptions=True)
    lost += sum(1 for x in after_idle + under_traffic if x is None)
    idle_ms = [x for x in after_idle if x is not None]
    traffic_ms = [x for x in under_traffic if x is not None]
    idle_sum, traffic_sum = _summary(idle_ms), _summary(traffic_ms)
    total = round(sum(cores.values()), 4)
    excess = (None if idle_sum["p50"] is None or traffic_sum["p50"] is None
              else round(idle_sum["p50"] - traffic_sum["p50"], 1))
    return {
        "idle_cores": dict(sorted(cores.items(), key=lambda kv: -kv[1])), "idle_cores_total": total,
        "host_cpu_during_sample": host_cpu,
        "first_after_idle_minute_ms": first, "after_idle_ms": after_idle, "after_idle": idle_sum,
        "traffic": traffic_sum,
        "after_idle_minus_traffic_p50_ms": excess,
        "goal": {"cores": GOAL_CORES, "latency_ms": GOAL_LATENCY_MS, "cores_met": total < GOAL_CORES,
                 "latency_met": excess is not None and excess <= GOAL_LATENCY_MS},
        "lost": lost,
        "failed": f"{lost} message(s) not delivered" if lost else None,
    }


def main(idle: float = typer.Option(60.0, help="seconds of quiet before the CPU sample"),
         sample: float = typer.Option(30.0, help="seconds of CPU sampled"),
         rounds: int = typer.Option(5, min=1, help="messages after a gap of quiet, after the first"),
         gap: float = typer.Option(5.0, help="seconds of quiet before each of those"),
         rate: float = typer.Option(10.0, help="messages/s of the steady traffic compared with"),
         traffic: float = typer.Option(10.0, help="seconds of that traffic"),
         quick: bool = typer.Option(False, "--quick", help="20 s of quiet, 10 s sampled"),
         publish: bool = typer.Option(False, "--publish",
                                      help="write loadtest/results/idle-latest.json and the page's tables"),
         out: Path | None = typer.Option(None, help=f"the result JSON (default {OUT_DEFAULT})"),
         setting: list[str] = typer.Option([], "--set", help="KEY=VALUE: a setting of every process "
                                           "(e.g. CHAT_FERRETDB_TAIL_IDLE_POLL_MS=2000), for an A/B")) -> None:
    """One run on a private system of its own, deployed as `make run` deploys it."""
    from harness.system import databases, running_system
    from loadtest.bench import AS_DEPLOYED, DEPLOYED_DAEMONS

    if quick:
        idle, sample = 20.0, 10.0
    env = dict(kv.split("=", 1) for kv in setting)
    params = {"settings": env, "idle_seconds": idle, "sample_seconds": sample, "rounds": rounds, "gap_seconds": gap,
              "rate": rate, "traffic_seconds": traffic}
    extra: dict[str, Any] = {"CHAT_RATE_LIMIT_PER_SECOND": "0", **env}
    started = time.monotonic()
    with databases(Path(tempfile.mkdtemp(prefix="idle-dbs-"))) as dbs:
        with running_system(dbs, daemons=DEPLOYED_DAEMONS, **AS_DEPLOYED, **extra) as system:
            system.start("pusher")
            measured = asyncio.run(measure(system, dbs, idle, sample, rounds, gap, rate, traffic))
    result = {"machine": machine.describe(), "parameters": params,
              "deployed": {**AS_DEPLOYED, "daemons": DEPLOYED_DAEMONS, "pusher": True},
              "wall_seconds": round(time.monotonic() - started), **measured}
    write_result(result, out or (OUT_PUBLISHED if publish else OUT_DEFAULT), idle_table, publish, "idle")


if __name__ == "__main__":
    typer.run(main)
