"""The daemon tier fed with recorded oplog entries, replayed in-process.

FerretDB's own ceiling (a tail whose cost grows with the oplog, about 24k
inserts/s) would hide the daemons' speed, so this benchmark records real
oplog entries from FerretDB once, then feeds them to real daemon processes
through the ``Stream`` in place of the oplog tail, at a set rate or as fast as
the daemon takes them. Everything after the tail is the production code:
sequencer, hub, lean WebSocket server, sockets, and N real clients in other
processes that check every id arrives once (lost and duplicated must be 0).

Each replayed entry keeps the recorded shape (``op``, ``ns``, ``o``, ``ts``,
``wall``...) with a fresh id, a random pair of the connected users, and the
replay time in the body. Every message then goes to two connections, its
recipient's and its sender's (the sender's other device). With
``--senders-offline`` the senders are users with no connection, so each
message is one frame, as when a server's HTTP API publishes to one user's
channel: the unit of Centrifugo's published figures. Measured: oplog entry handed to the stream → frame
written to every socket (the daemon's histogram), messages/s and frames/s
delivered, daemon CPU per message, and client-side end-to-end latency.

    python -m loadtest.replay --clients 10000 --rate 2000 --count 20000
    python -m loadtest.replay --clients 10000 --rate 0 --count 200000   # as fast as it goes
    python -m loadtest.replay --clients 10000 --rate 0 --count 200000 --senders-offline
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import bson
import orjson
import pymongo
import typer
import uvloop
from bson import Timestamp
from tqdm import tqdm

from chat.auth_config import require_safe_auth
from chat.logs import setup_logging
from chat.settings import Settings
from loadtest.common import machine
from loadtest.common import scrape
from loadtest import wsload
from loadtest.wsload import WsloadJob
from oplog.events import Batch, OplogEvent, Restarted

RECORD_DB = "chat_replay"
HISTOGRAM = "chat_daemon_oplog_to_socket_seconds"
GC_PAUSES = "chat_daemon_gc_pause_seconds"
GC_GENERATIONS = ("1", "2")  # generation 0 passes take well under a millisecond


def record(mongo_url: str, count: int = 1000) -> list[dict]:
    """Inserts `count` messages into FerretDB in batches of 100, as the writer
    does, and reads back the oplog entries it wrote for them."""
    client: pymongo.MongoClient[dict] = pymongo.MongoClient(mongo_url)
    try:
        coll, oplog = client[RECORD_DB]["messages"], client["local"]["oplog.rs"]
        entries: list[dict] = []
        for start in range(0, count, 100):
            docs = [{"_id": i, "from": "a", "to": "b", "body": "recorded " * 4, "client_msg_id": None,
                     "created_at": datetime.now(UTC)} for i in range(start + 1, start + 101)]
            coll.insert_many(docs)
            got = list(oplog.find({"ns": f"{RECORD_DB}.messages", "op": "i"}).sort("$natural", -1).limit(100))
            entries += reversed(got)
        return entries
    finally:
        client.close()


def pairs(clients: int, count: int, seed: int = 7) -> list[tuple[int, int]]:
    """Who sends to whom, message by message: the same list in every process."""
    rng = random.Random(seed)

    def pair() -> tuple[int, int]:
        sender, recipient = rng.sample(range(clients), 2)
        return sender, recipient

    return [pair() for _ in range(count)]


class ReplayTail:
    """An ``oplog.events.OplogSource`` in place of the oplog tail: yields recorded entries with
    fresh ids from 1, once SIGUSR1 says the clients are connected."""

    def __init__(self, entries: list[dict], clients: int, count: int, rate: float, batch: int,
                 senders_offline: bool = False):
        self.entries, self.count, self.rate, self.batch = entries, count, rate, batch
        self.sender_prefix = "x" if senders_offline else "r"  # connected users are r0, r1, ...
        self.namespace = entries[0]["ns"]
        self.pairs = pairs(clients, count)
        self.last_ts: Timestamp | None = None
        self.go = asyncio.Event()

    async def newest_ts(self) -> Timestamp | None:
        return None

    async def batches(self) -> AsyncIterator[OplogEvent]:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.go.set)
        yield Restarted()
        await self.go.wait()
        start, sent = time.monotonic(), 0
        while sent < self.count:
            n = min(self.batch, self.count - sent)
            if self.rate:
                delay = start + (sent + n) / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let the consumer take what it was given
            now, wall = datetime.now(UTC), time.time()
            out = []
            for i in range(sent, sent + n):
                entry = self.entries[i % len(self.entries)]
                a, b = self.pairs[i]
                out.append({**entry, "o": {**entry["o"], "_id": i + 1, "from": f"{self.sender_prefix}{a}",
                                           "to": f"r{b}", "body": f"{wall:.6f} replay", "created_at": now}})
            sent += n
            yield Batch(out)
        await asyncio.Event().wait()  # a tail never ends


def serve(entries_file: Path, clients: int, count: int, rate: float, batch: int, senders_offline: bool) -> None:
    """A daemon process (``python -m loadtest.replay --serve``) whose stream reads the replay."""
    from daemon.lifecycle import run

    settings = Settings()
    setup_logging(settings.log_level)
    require_safe_auth(settings, "replay daemon")
    entries = bson.decode_all(entries_file.read_bytes())
    uvloop.run(run(settings, tail=ReplayTail(entries, clients, count, rate, batch, senders_offline)))


def bench(clients: int, rate: float, count: int, daemons: int, batch: int, progress: bool = True,
          senders_offline: bool = False) -> dict:
    from harness.servers import env_for, free_port, stop, wait_port
    from harness.system import databases

    tmp = Path(tempfile.mkdtemp(prefix="replay-"))
    with databases(tmp / "dbs") as dbs:
        entries = record(dbs.ferretdb.url)
        entries_file = tmp / "entries.bson"
        entries_file.write_bytes(b"".join(bson.encode(e) for e in entries))
        port = free_port()
        # The replayed messages are in no store, so a hole (a batch dropped under
        # overload) cannot be read back: the daemon skips it, and the run's own
        # check counts what it held as lost. Without MySQL the daemon does not
        # take the empty `messages` table's head (0) as the bound of what it trusts.
        env = env_for(dbs.mariadb, dbs.ferretdb, CHAT_DAEMON_PORT=str(port), CHAT_MONGO_DB="replay_empty",
                      CHAT_GAP_CHECK_SECONDS="3600", CHAT_LOG_LEVEL="WARNING", CHAT_MAX_CONNECTIONS="18000",
                      CHAT_PING_INTERVAL_SECONDS="60", CHAT_FILL_HOLES_FROM_MYSQL="false")
        procs = [subprocess.Popen([sys.executable, "-m", "loadtest.replay", "--serve", "--entries", str(entries_file),
                                   "--clients", str(clients), "--count", str(count), "--rate", str(rate),
                                   "--batch", str(batch), *(["--senders-offline"] if senders_offline else [])],
                                  env=env, stdout=sys.stderr, stderr=sys.stderr)
                 for _ in range(daemons)]
        try:
            for p in procs:
                wait_port(port, 20, p)
            time.sleep(1)
            return _drive(procs, port, env["CHAT_JWT_SECRET"], clients, rate, count, daemons, batch, progress,
                          senders_offline)
        finally:
            for p in procs:
                stop(p, signal.SIGTERM)


def _drive(procs: list[subprocess.Popen], port: int, secret: str, clients: int, rate: float, count: int, daemons: int,
           batch: int, progress: bool, senders_offline: bool) -> dict:
    users = [f"r{i}" for i in range(clients)]
    per_proc = wsload.CLIENTS_PER_PROC
    nprocs = max(1, -(-clients // per_proc))
    tmp = Path(tempfile.mkdtemp(prefix="replay-clients-"))
    ctx = mp.get_context("spawn")
    connected, frames, stop_ev = ctx.Value("i", 0), ctx.Value("l", 0), ctx.Event()
    jobs = [WsloadJob(users[k::nprocs], f"ws://127.0.0.1:{port}", secret, f"127.0.0.{2 + k}", str(tmp / f"c{k}.json"))
            for k in range(nprocs)]
    clients_procs = [ctx.Process(target=wsload._client_proc, args=(j, connected, frames, stop_ev), daemon=True)
                     for j in jobs]
    for p in clients_procs:
        p.start()
    bar = tqdm(total=clients, desc=f"connecting {clients}", unit="conn", disable=not progress, leave=False)
    deadline = time.monotonic() + 60 + clients / 200
    while connected.value < clients and time.monotonic() < deadline:
        bar.n = connected.value
        bar.refresh()
        time.sleep(0.2)
    bar.close()
    held = connected.value
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    before = scrape.histograms(metrics_url, HISTOGRAM, daemons)
    gc_before = {g: scrape.histograms(metrics_url, GC_PAUSES, daemons, labels=f'generation="{g}"')
                 for g in GC_GENERATIONS}
    daemon_cpu = machine.ProcessCpu([p.pid for p in procs])
    host = machine.CpuWindow()
    # every message goes to its recipient's connection, and to its sender's unless offline
    want = count if senders_offline else 2 * count
    started = time.monotonic()
    for daemon in procs:
        daemon.send_signal(signal.SIGUSR1)
    bar = tqdm(total=want, desc="frames", unit="frame", disable=not progress, leave=False)
    last, still = frames.value, time.monotonic()
    while frames.value < want and time.monotonic() - still < 10:
        time.sleep(0.05)
        bar.n = frames.value
        bar.refresh()
        if frames.value != last:
            last, still = frames.value, time.monotonic()
    elapsed = time.monotonic() - started
    bar.close()
    cpu = daemon_cpu.seconds()
    host_cpu = host.result()
    buckets = scrape.merged_delta(before, scrape.histograms(metrics_url, HISTOGRAM, daemons))
    gc_pauses = {g: _pauses(scrape.merged_delta(gc_before[g], scrape.histograms(
        metrics_url, GC_PAUSES, daemons, labels=f'generation="{g}"'))) for g in GC_GENERATIONS}
    stop_ev.set()
    for p in clients_procs:
        p.join(60)
    received: dict[str, list[int]] = {}
    latencies: list[float] = []
    dups = failures = 0
    for job in jobs:
        data = orjson.loads(Path(job.out).read_bytes())
        received.update(data["received"])
        latencies += data["latencies"]
        dups += data["duplicates"]
        failures += data["failures"]
    expected: dict[str, set[int]] = {}
    for i, (a, b) in enumerate(pairs(clients, count)):
        if not senders_offline:
            expected.setdefault(f"r{a}", set()).add(i + 1)
        expected.setdefault(f"r{b}", set()).add(i + 1)
    lost = sum(len(ids - set(received.get(u, []))) for u, ids in expected.items())
    delivered = sum(len(v) for v in received.values())
    total = buckets.get(float("inf"), 0.0)
    return {
        "clients": clients, "held": held, "connect_failures": failures, "daemons": daemons,
        "rate": rate or "max", "batch": batch, "senders_offline": senders_offline, "messages": count,
        "frames_expected": want, "frames_delivered": delivered,
        "lost": lost, "duplicates": dups, "seconds": round(elapsed, 2),
        "messages_per_s": round(count / elapsed), "frames_per_s": round(delivered / elapsed),
        "daemon_cpu_us_per_message": round(cpu / count / daemons * 1e6, 1),
        "oplog_to_socket_ms": {"p50": _ms(scrape.quantile(buckets, .5)), "p99": _ms(scrape.quantile(buckets, .99)),
                               "share_within_5ms": round(buckets.get(0.005, 0.0) / total, 4) if total else None,
                               "n": int(total)},
        "e2e_ms": wsload.percentiles(latencies), "host_cpu": host_cpu, "gc_pauses": gc_pauses,
        "where": "daemon processes fed recorded FerretDB 1.24 oplog entries in-process; no database on the path",
    }


def _pauses(buckets: dict[float, float]) -> dict:
    """The daemon's GC passes of one generation during the run: how many, how many
    over 5 ms, and the bucket bound of the longest."""
    n = int(buckets.get(float("inf"), 0))
    longest = min((le for le, v in buckets.items() if v >= n), default=None) if n else None
    return {"n": n, "over_5ms": n - int(buckets.get(0.005, 0)), "max_ms_bucket": _ms(longest)}


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


def tick_batch(rate: float) -> int:
    """Entries per oplog batch: what 10 ms of traffic brings (FerretDB re-checks a
    tail every 10 ms); as fast as it goes, batches of 100."""
    return max(1, int(rate / 100)) if rate else 100


def main(clients: int = typer.Option(10_000),
         rate: float = typer.Option(2000.0, help="messages/s; 0 = as fast as it goes"),
         count: int = typer.Option(20_000), daemons: int = typer.Option(1),
         batch: int = typer.Option(0, help="entries per oplog batch; 0 = what 10 ms of traffic brings"),
         senders_offline: bool = typer.Option(False, "--senders-offline",
                                              help="senders have no connection: one frame per message"),
         out: Path | None = typer.Option(None), serve_mode: bool = typer.Option(False, "--serve", hidden=True),
         entries: Path | None = typer.Option(None, hidden=True)) -> None:
    if serve_mode:
        if entries is None:
            raise typer.BadParameter("--serve replays the entries of --entries")
        serve(entries, clients, count, rate, batch or tick_batch(rate), senders_offline)
        return
    result = bench(clients, rate, count, daemons, batch or tick_batch(rate), senders_offline=senders_offline)
    wsload.publish(result, out)
    wsload.verify(result, "replay")


if __name__ == "__main__":
    typer.run(main)
