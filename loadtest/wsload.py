"""WebSocket load generator: N authenticated clients over several processes
(each process may open at most 20,000 files) and several source addresses
(127.0.0.2, .3, ...: ~28k ephemeral ports per address pair), messages sent
through the API between random pairs at a set rate, with the send time in
the body. Counts lost and duplicated messages; both must be 0."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import random
import resource
import secrets
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import orjson
import psutil
import typer
import uvloop
from tqdm import tqdm

from chat import auth
from chatctl.client import Inbox
from loadtest.clients import lean as leanclient
from loadtest.common import machine

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

    from harness.system import System

CLIENTS_PER_PROC = 15_000  # under the 20k open-files limit, with room to spare
SEND_CONNECTIONS = 64  # keep-alive connections the sender posts over


@dataclass
class WsloadJob:
    users: list[str]
    ws_url: str
    secret: str
    source: str
    out: str


def _client_proc(job: WsloadJob, connected: Synchronized[int], frames: Synchronized[int], stop: Event) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(_clients(job, connected, frames, stop))


async def _clients(job: WsloadJob, connected: Synchronized[int], frames: Synchronized[int], stop: Event) -> None:
    inboxes = {u: Inbox() for u in job.users}
    latencies: list[float] = []
    since_stored: list[float] = []  # from the commit's time stamp (created_at, ms precision)
    failures = 0
    clients: list[leanclient.LeanClient] = []
    gate = asyncio.Semaphore(200)  # handshakes in flight: stay under somaxconn (4096)
    host, port = job.ws_url.removeprefix("ws://").rsplit(":", 1)
    counted = 0

    def on_frame(doc: dict, now: float) -> None:
        nonlocal counted
        latencies.append(now - float(doc["body"].split(" ", 1)[0]))
        since_stored.append(now - datetime.fromisoformat(doc["created_at"]).timestamp())
        counted += 1

    async def one(user: str) -> None:
        nonlocal failures
        token = auth.mint(job.secret, user, 7200)
        for attempt in range(5):
            try:
                async with gate:
                    clients.append(await leanclient.connect(host, int(port), token, inboxes[user], on_frame,
                                                            source=job.source))
                with connected.get_lock():
                    connected.value += 1
                return
            except (OSError, ConnectionError):
                await asyncio.sleep(0.2 * (attempt + 1))
        failures += 1

    tasks = [asyncio.create_task(one(u)) for u in job.users]
    while not stop.is_set():
        await asyncio.sleep(0.1)
        if counted:  # shared counter: one lock per tick, not per frame
            with frames.get_lock():
                frames.value += counted
            counted = 0
    for t in tasks:
        t.cancel()
    for c in clients:
        c.transport.abort()
    await asyncio.gather(*tasks, return_exceptions=True)
    Path(job.out).write_bytes(orjson.dumps({
        "received": {u: box.ids for u, box in inboxes.items()},
        "duplicates": sum(box.duplicates for box in inboxes.values()),
        "latencies": latencies, "since_stored": since_stored, "failures": failures}))


def _established(pid: int) -> int:
    return sum(1 for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED)


def _rss(pids: list[int]) -> int:
    return sum(psutil.Process(p).memory_info().rss for p in pids)


async def _send(api_url: str, secret: str, users: list[str], rate: float, seconds: float,
                progress: bool, seed: int = 1) -> tuple[dict[str, list[int]], list[float], int, list[str]]:
    """Posts `rate` messages/s for `seconds` between random pairs (drawn from ``seed``); returns
    (expected: user -> ids, creation latencies in s, errors)."""
    rng = random.Random(seed)
    # Ids of this run only: a second run on the same system (the same users)
    # would otherwise repeat the first one's client_msg_ids, get 409s, and
    # send fewer messages than it says.
    run_tag = secrets.token_hex(4)
    expected: dict[str, list[int]] = {}
    creation: list[float] = []
    errors = 0
    refused: list[str] = []
    tokens: dict[str, str] = {}
    # aiohttp, not httpx: at a few hundred requests/s httpx's pool bookkeeping
    # took most of this process's CPU, and its queueing showed up as
    # "creation" and end-to-end latency that the system never had.
    connector = aiohttp.TCPConnector(limit=SEND_CONNECTIONS)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        gate = asyncio.Semaphore(SEND_CONNECTIONS)  # requests in flight; more would only queue in the pool
        url = f"{api_url}/v1/messages"

        async def one(i: int) -> None:
            async with gate:
                await send_one(i)

        async def send_one(i: int) -> None:
            nonlocal errors
            a, b = rng.sample(users, 2)
            tok = tokens.get(a) or tokens.setdefault(a, auth.mint(secret, a, 7200))
            headers = {"Authorization": f"Bearer {tok}", "Content-Type": "application/json"}
            t0 = time.time()
            body = orjson.dumps({"to": b, "body": f"{t0:.6f} load", "client_msg_id": f"L{run_tag}-{i}"})
            for attempt in range(5):
                try:
                    async with session.post(url, data=body, headers=headers) as r:
                        answer = await r.read()
                    if r.status in (200, 201):
                        creation.append(time.time() - t0)
                        msg_id = int(orjson.loads(answer)["id"])
                        expected.setdefault(b, []).append(msg_id)
                        expected.setdefault(a, []).append(msg_id)  # the sender's own connection gets it too
                        return
                    if 400 <= r.status < 500 and r.status != 429:  # the generator's fault: retrying cannot help
                        refused.append(f"{r.status} {answer[:200].decode(errors='replace')}")
                        return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                errors += 1
                await asyncio.sleep(0.1 * (attempt + 1))

        total = int(rate * seconds)
        bar = tqdm(total=total, desc="sending", unit="msg", disable=not progress, leave=False)
        start = time.monotonic()
        tasks = []
        for i in range(total):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
            bar.update(1)
        await asyncio.gather(*tasks)
        bar.close()
    return expected, creation, errors, refused


def percentiles(values: list[float], scale: float = 1000.0) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "n": 0}
    v = sorted(values)

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * len(v)))] * scale, 2)

    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": round(v[-1] * scale, 2), "n": len(v)}


def run(system: System, clients: int, rate: float, seconds: float, progress: bool = True, settle: float = 10.0,
        alongside: contextlib.AbstractContextManager | None = None) -> dict:
    """One load run against a running System; returns its measured figures.
    ``alongside`` is entered for the send window only (once every client is
    connected): a measurement of the same load, such as FerretDB's own tail."""
    daemon_pids = [p.pid for n, p in system.procs.items() if n.startswith("daemon")]
    users = [f"load{clients}-{i}" for i in range(clients)]
    procs_needed = max(1, -(-clients // CLIENTS_PER_PROC))
    tmp = Path(tempfile.mkdtemp(prefix="wsload-"))
    ctx = mp.get_context("spawn")
    connected, frames, stop = ctx.Value("i", 0), ctx.Value("l", 0), ctx.Event()
    rss_before = _rss(daemon_pids)
    jobs, procs = [], []
    for k in range(procs_needed):
        job = WsloadJob(users[k::procs_needed], system.ws_url, system.secret, f"127.0.0.{2 + k}",
                        str(tmp / f"c{k}.json"))
        proc = ctx.Process(target=_client_proc, args=(job, connected, frames, stop), daemon=True)
        proc.start()
        jobs.append(job)
        procs.append(proc)
    started = time.monotonic()
    bar = tqdm(total=clients, desc=f"connecting {clients}", unit="conn", disable=not progress, leave=False)
    while connected.value < clients and time.monotonic() - started < 60 + clients / 200:
        bar.n = connected.value
        bar.refresh()
        time.sleep(0.2)
    bar.close()
    connect_seconds = time.monotonic() - started
    held = connected.value
    time.sleep(1.0)
    rss_after = _rss(daemon_pids)
    per_daemon = [{"pid": pid, "connections": _established(pid), "rss_mb": round(_rss([pid]) / 2**20, 1)}
                  for pid in daemon_pids]
    host = machine.CpuWindow()
    with alongside or contextlib.nullcontext():
        expected, creation, send_errors, refused = asyncio.run(
            _send(system.api_url, system.secret, users, rate, seconds, progress))
        host_cpu = host.result()
    # Wait for delivery to finish: until every expected frame arrived, or no
    # progress for `settle` seconds (then what is missing counts as lost).
    want = sum(len(v) for v in expected.values())
    last, still = frames.value, time.monotonic()
    while frames.value < want and time.monotonic() - still < settle:
        time.sleep(0.2)
        if frames.value != last:
            last, still = frames.value, time.monotonic()
    stop.set()
    for p in procs:
        p.join(60)
    received: dict[str, list[int]] = {}
    latencies: list[float] = []
    since_stored: list[float] = []
    failures = dups = 0
    for job in jobs:
        data = orjson.loads(Path(job.out).read_bytes())
        received.update(data["received"])
        latencies += data["latencies"]
        since_stored += data["since_stored"]
        failures += data["failures"]
        dups += data["duplicates"]  # repeats the clients' Inbox dropped (the reference client's dedup)
    lost = 0
    for user, ids in expected.items():
        got = received.get(user, [])
        dups += len(got) - len(set(got))
        lost += len(set(ids) - set(got))
    delivered = sum(len(v) for v in received.values())
    return {
        "clients": clients, "held": held, "connect_failures": failures, "client_procs": procs_needed,
        "connect_seconds": round(connect_seconds, 1), "rate": rate, "seconds": seconds,
        "asked": int(rate * seconds), "sent": len(creation), "send_errors": send_errors,
        "refused": len(refused), "refused_examples": refused[:3], "delivered": delivered,
        "delivered_per_s": round(delivered / seconds, 1), "lost": lost, "duplicates": dups,
        "e2e_ms": percentiles(latencies), "creation_ms": percentiles(creation), "host_cpu": host_cpu,
        "stored_to_client_ms": percentiles(since_stored),
        "daemon_rss_kb_per_conn": round((rss_after - rss_before) / max(1, held) / 1024, 1),
        "daemon_rss_mb": round(rss_after / 2**20, 1), "per_daemon": per_daemon,
    }



def main(clients: int = typer.Option(1000), rate: float = typer.Option(200.0, help="messages/s through the API"),
         seconds: float = typer.Option(10.0), daemons: int = typer.Option(2), apis: int = typer.Option(2),
         writer: bool = typer.Option(True, help="the API processes write through one writer process, as deployed"),
         relay: bool = typer.Option(True, help="the daemons tail the oplog through one relay process, as deployed"),
         out: Path | None = typer.Option(None, help="write the result JSON here")) -> None:
    """One load run on a private system of its own (MariaDB, FerretDB, API, daemons on free ports)."""
    from harness.system import databases, running_system

    with databases(Path(tempfile.mkdtemp(prefix="wsload-dbs-"))) as dbs:
        with running_system(dbs, daemons=daemons, apis=apis, writer=writer, relay=relay, CHAT_RATE_LIMIT_PER_SECOND="0",
                            CHAT_LOG_LEVEL="WARNING") as system:
            result = run(system, clients, rate, seconds)
    publish(result, out)
    verify(result, "wsload")


def publish(result: dict, out: Path | None) -> None:
    text = orjson.dumps(result, option=orjson.OPT_INDENT_2)
    print(text.decode())
    if out is not None:
        out.write_bytes(text)


def verify(result: dict, what: str) -> None:
    """A run that lost or duplicated a message, could not hold its clients, or
    did not get every message it was asked to send stored, fails loudly: its
    figures would describe a smaller load than the one it names."""
    if result["lost"] or result["duplicates"] or result["held"] < result["clients"]:
        raise SystemExit(f"FAILED {what}: {result['lost']} lost, {result['duplicates']} duplicated, "
                         f"{result['held']}/{result['clients']} held")
    if "asked" in result and (result["refused"] or result["sent"] < result["asked"]):
        raise SystemExit(f"FAILED {what}: {result['sent']} of {result['asked']} messages stored, "
                         f"{result['refused']} refused (e.g. {result['refused_examples']})")


if __name__ == "__main__":
    typer.run(main)
