"""Which carrier for typing and presence signals (docs/presence.md): Redis pub/sub, or the fast
store's own oplog. The figures of docs/decisions/signals-over-redis.md.

`python -m loadtest.signals_carrier [--only carriers|delivery] [--publish]`, two sections:

``carriers``: the signal's own latency. A publisher process sends R signals/s for S seconds and a
receiver process stamps each on arrival (publish -> receipt, the wall clock of one machine):

- ``redis``: PUBLISH on one connection, a SUBSCRIBEd connection receives (a private
  ``redis-server``, nothing saved);
- ``mongo``: each signal inserted into a capped collection (``chat.signals``) of FerretDB, read
  back from a tail of ``local.oplog.rs`` narrowed to it: ``oplog.tail.OplogTail``, the relay's and
  the daemons' own tailer, which on FerretDB polls every ``CHAT_FERRETDB_TAIL_POLL_MS`` (20 ms).

Each carrier is measured on loopback and through one Toxiproxy with 1 ms added each way (both
the publisher's and the receiver's connections go through it, as between hosts). Both
publishers work alike: what is queued while one round trip is in flight goes in the next (a
pipeline of PUBLISHes, or one ``insert_many``), one connection, one round trip at a time. Their
CPU per signal is the process's own (psutil), as is the receiver's and the server's.

``delivery``: the signals' effect on messages. The system as `make run` deploys it (the writer,
the relay, the API processes, the daemons) on a fresh MariaDB and FerretDB, WebSocket clients
and messages posted through the API (``loadtest.wsload``); phases ``alone``, ``redis`` (R
signals/s through Redis meanwhile, a subscriber receiving them) and ``mongo`` (R signals/s
inserted into ``chat.signals`` of the same FerretDB, so into the same oplog as the messages, and
tailed back), interleaved for ``--rounds`` rounds. The figures are each phase's delivery p50/p99
over the ``alone`` phase of the same round.

Writes var/bench/signals-carrier.json, or with ``--publish``
loadtest/results/signals-carrier.json. FerretDB 1.24's figures, not MongoDB's: there the tail
waits on the server (awaitData) instead of polling, so the oplog carrier's floor is lower; the
oplog is still one ordered stream that messages and signals would share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import orjson
import psutil
import typer
import uvloop

from harness.servers import ROOT, free_port, stop, wait_port
from loadtest import wsload
from loadtest.common import machine
from loadtest.common.results import RESULTS, UNPUBLISHED
from loadtest.common.units import per_unit_us, ratio

if TYPE_CHECKING:
    from multiprocessing.context import SpawnContext
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

    from harness.system import System

REDIS, MONGO = "redis", "mongo"
PACING = "pacing"  # a publisher that sends nothing: the CPU of its own loop, the floor under the others'
CARRIERS = (REDIS, MONGO)
ALONE = "alone"
PHASES = (ALONE, REDIS, MONGO)
DIRECT, PROXIED = "direct", "toxiproxy"
CHANNEL = "chat:typing:0"  # docs/presence.md: typing for partition 0
SIGNALS_DB, SIGNALS_COLLECTION = "chat", "signals"
SIGNALS_CAPPED_DOCS = 1000  # a second of signals at 1,000/s: the reader wants the oplog, not the collection
TAIL_POLL_MS = 20.0  # CHAT_FERRETDB_TAIL_POLL_MS, as deployed (chat/settings.py)
PROXY_MS_EACH_WAY = 1
REDIS_SERVER = "redis-server"
TOXIPROXY = ROOT / ".cache/toxiproxy/bin/toxiproxy-server"
OUT_DEFAULT = UNPUBLISHED / "signals-carrier.json"
OUT_PUBLISHED = RESULTS / "signals-carrier.json"
NATS = ("not measured: no NATS server is installed on this machine, and none could be set up "
        "quickly here (it would be built from source, as scripts/install-centrifugo.sh builds Centrifugo)")


# --- the two processes: a publisher and a receiver -------------------------------------------


@dataclass
class Endpoint:
    """Where a carrier's processes connect: Redis ``host:port`` or a Mongo URL."""
    carrier: str
    redis: tuple[str, int] | None = None
    mongo_url: str | None = None


@dataclass
class CarrierShared:
    """What the main process and a publisher/receiver pair share."""
    ready: Event  # the receiver is subscribed / its tail is open
    published: Event  # the publisher is connected and waits for ``go``
    go: Event
    stop: Event  # the publisher stops early (the delivery section: at the end of the send window)
    done: Event  # the receiver stops
    received: Synchronized[int]


def signal_doc(run: str, seq: int, at: float) -> dict[str, Any]:
    """A typing signal as docs/presence.md shapes it, with its run, sequence number and send time."""
    return {"type": "typing", "from": f"u{seq % 997}", "to": f"u{seq * 7 % 1009}", "state": "start",
            "ttl": 5, "run": run, "seq": seq, "t": at}


class Pump:
    """One connection, one round trip at a time: what is queued while one is in flight goes in
    the next (a pipeline of PUBLISHes, or one insert_many). Both carriers' publishers use it."""

    def __init__(self, send: Callable[[list[dict]], Awaitable[None]]) -> None:
        self._send = send
        self.queue: list[dict] = []
        self.wake = asyncio.Event()
        self.busy = False
        self.round_trips = 0
        self.failed = 0

    def put(self, doc: dict) -> None:
        self.queue.append(doc)
        self.wake.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue:
                batch, self.queue = self.queue, []
                self.busy = True
                try:
                    await self._send(batch)
                except Exception:  # counted: a signal carrier drops, it does not retry
                    self.failed += len(batch)
                finally:
                    self.busy = False
                self.round_trips += 1

    async def drain(self, limit: float) -> None:
        deadline = time.monotonic() + limit
        while (self.queue or self.busy) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # pacing: waits for the last round trip


def _publisher_proc(endpoint: Endpoint, run: str, rate: float, seconds: float, out: str, shared: CarrierShared) -> None:
    uvloop.run(_publish(endpoint, run, rate, seconds, out, shared))


async def _publish(endpoint: Endpoint, run: str, rate: float, seconds: float, out: str, shared: CarrierShared) -> None:
    close: Callable[[], Awaitable[Any]]
    if endpoint.carrier == PACING:

        async def send(batch: list[dict]) -> None:
            pass

        async def nothing() -> None:
            pass

        close = nothing
    elif endpoint.carrier == REDIS:
        import redis.asyncio as aioredis

        assert endpoint.redis is not None
        rconn = aioredis.Redis(host=endpoint.redis[0], port=endpoint.redis[1], max_connections=1)
        await rconn.ping()

        async def send(batch: list[dict]) -> None:
            pipe = rconn.pipeline(transaction=False)
            for doc in batch:
                pipe.publish(CHANNEL, orjson.dumps(doc))
            await pipe.execute()

        close = rconn.aclose
    else:
        from pymongo import AsyncMongoClient

        assert endpoint.mongo_url is not None
        client: AsyncMongoClient = AsyncMongoClient(endpoint.mongo_url, maxPoolSize=1)
        signals = client[SIGNALS_DB][SIGNALS_COLLECTION]
        await client.admin.command("ping")

        async def send(batch: list[dict]) -> None:
            await signals.insert_many(batch, ordered=False)

        close = client.close
    pump = Pump(send)
    pumping = asyncio.create_task(pump.run())
    shared.published.set()
    while not shared.go.is_set():
        await asyncio.sleep(0.01)  # pacing: waits for the main process's start
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    total = int(rate * seconds)
    start = time.monotonic()
    sent = 0
    most_late = 0.0
    ticks = 0
    while sent < total:
        now = time.monotonic()
        due = min(total, int((now - start) * rate) + 1)
        most_late = max(most_late, (now - start) - sent / rate)
        while sent < due:
            pump.put(signal_doc(run, sent, time.time()))
            sent += 1
        ticks += 1
        if ticks % 100 == 0 and shared.stop.is_set():
            break
        await asyncio.sleep(0.001)  # pacing: the next millisecond's signals
    window = time.monotonic() - start
    await pump.drain(10)
    cpu = sum(me.cpu_times()[:2]) - cpu0
    pumping.cancel()
    await asyncio.gather(pumping, return_exceptions=True)
    await close()
    Path(out).write_bytes(orjson.dumps({
        "sent": sent, "seconds": round(window, 2), "cpu_seconds": round(cpu, 3), "round_trips": pump.round_trips,
        "failed": pump.failed, "most_late_ms": round(most_late * 1000, 1)}))


def _receiver_proc(endpoint: Endpoint, run: str, out: str, shared: CarrierShared) -> None:
    # The tail's re-opens are counted (``restarts``), not logged: its first open beside the
    # messages always reports a fall-off (it starts at the oplog's newest entry, a message's).
    logging.getLogger("chat.oplog").setLevel(logging.CRITICAL)
    uvloop.run(_receive(endpoint, run, out, shared))


async def _receive(endpoint: Endpoint, run: str, out: str, shared: CarrierShared) -> None:
    latencies: list[float] = []
    seen: set[int] = set()
    repeats = others = 0
    restarts = 0
    me = psutil.Process()
    cpu0 = 0.0

    def listening() -> None:
        """Connected and subscribed: its CPU is counted from here."""
        nonlocal cpu0
        if not shared.ready.is_set():
            cpu0 = sum(me.cpu_times()[:2])
            shared.ready.set()

    def got(doc: dict, now: float) -> None:
        nonlocal repeats, others
        if doc.get("run") != run:
            others += 1  # an earlier run's, still in the oplog where this tail starts
            return
        seq = int(doc["seq"])
        if seq in seen:
            repeats += 1  # the oplog tail re-reads the entry it resumes from (oplog/tail.py)
            return
        seen.add(seq)
        latencies.append(now - float(doc["t"]))

    async def count() -> None:
        told = 0
        while True:
            await asyncio.sleep(0.05)  # pacing: the shared counter once per tick, not per signal
            if len(seen) != told:
                shared.received.value = told = len(seen)

    async def receive() -> None:
        nonlocal restarts
        if endpoint.carrier == PACING:
            listening()
            await asyncio.Event().wait()  # receives nothing, until cancelled
        elif endpoint.carrier == REDIS:
            import redis.asyncio as aioredis

            assert endpoint.redis is not None
            rconn = aioredis.Redis(host=endpoint.redis[0], port=endpoint.redis[1])
            pubsub = rconn.pubsub()
            await pubsub.subscribe(CHANNEL)
            listening()
            try:
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        got(orjson.loads(message["data"]), time.time())
            finally:
                await pubsub.aclose()
                await rconn.aclose()
        else:
            from pymongo import AsyncMongoClient

            from oplog.events import Batch, Restarted
            from oplog.tail import OplogTail

            assert endpoint.mongo_url is not None
            client: AsyncMongoClient = AsyncMongoClient(endpoint.mongo_url, maxPoolSize=2)
            tail = OplogTail(client, f"{SIGNALS_DB}.{SIGNALS_COLLECTION}", ferretdb_poll_seconds=TAIL_POLL_MS / 1000)
            try:
                async for event in tail.batches():
                    if isinstance(event, Restarted):
                        restarts += 1
                        listening()
                        continue
                    if not isinstance(event, Batch):
                        continue
                    now = time.time()
                    for entry in event.entries:
                        if entry.get("op") == "i":
                            got(entry["o"], now)
            finally:
                await client.close()

    tasks = [asyncio.create_task(receive()), asyncio.create_task(count())]
    while not shared.done.is_set() and not tasks[0].done():
        await asyncio.sleep(0.05)  # pacing: looks at the main process's stop
    error = None
    if tasks[0].done() and not tasks[0].cancelled() and tasks[0].exception() is not None:
        error = repr(tasks[0].exception())
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    cpu = sum(me.cpu_times()[:2]) - cpu0
    Path(out).write_bytes(orjson.dumps({
        "latencies": latencies, "received": len(seen), "repeats": repeats, "others": others, "restarts": restarts,
        "cpu_seconds": round(cpu, 3), "error": error}))


class Foreign:
    """The CPU of processes that are not this run's over a window (other work on a shared machine):
    those alive at both ends of it, so short-lived ones are missed. Cores, on average."""

    def __init__(self) -> None:
        self._start, self._at = self._snapshot(), time.monotonic()

    @staticmethod
    def _snapshot() -> dict[int, float]:
        mine = {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
        used = {}
        for proc in psutil.process_iter(["cpu_times"]):
            times = proc.info["cpu_times"]
            if proc.pid not in mine and times is not None:
                used[proc.pid] = times.user + times.system
        return used

    def cores(self) -> float:
        end = self._snapshot()
        busy = sum(end[pid] - self._start[pid] for pid in end.keys() & self._start.keys())
        return round(busy / (time.monotonic() - self._at), 2)


class SignalLoad:
    """A publisher and a receiver of one carrier, run for a window: entered, the receiver is
    listening and the publisher sending; left, the publisher has stopped (after ``seconds``, or
    at the exit if ``stop_at_exit``) and the receiver has had what was sent, or ``settle`` s."""

    def __init__(self, ctx: SpawnContext, endpoint: Endpoint, rate: float, seconds: float,
                 servers: dict[str, list[int]], stop_at_exit: bool, settle: float = 5.0) -> None:
        self.ctx, self.endpoint, self.rate, self.seconds, self.settle = ctx, endpoint, rate, seconds, settle
        self.servers, self.stop_at_exit = servers, stop_at_exit
        self.result: dict = {}
        self.latencies: list[float] = []
        self._tmp = Path(tempfile.mkdtemp(prefix="signals-"))
        self._run = secrets.token_hex(4)

    def __enter__(self) -> SignalLoad:
        ctx = self.ctx
        self.shared = CarrierShared(ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event(), ctx.Value("l", 0))
        self._receiver = ctx.Process(target=_receiver_proc, daemon=True,
                                     args=(self.endpoint, self._run, str(self._tmp / "receiver.json"), self.shared))
        self._publisher = ctx.Process(target=_publisher_proc, daemon=True,
                                      args=(self.endpoint, self._run, self.rate, self.seconds,
                                            str(self._tmp / "publisher.json"), self.shared))
        self._receiver.start()
        self._publisher.start()
        waits = (("the receiver listens", self.shared.ready), ("the publisher is connected", self.shared.published))
        for what, event in waits:
            if not event.wait(60):
                self._end()
                raise RuntimeError(f"{self.endpoint.carrier}: never happened within 60 s: {what}")
        time.sleep(0.2)  # the tail yields Restarted just before its first getMore
        self._cpu = {name: machine.ProcessCpu(pids) for name, pids in self.servers.items()}
        self._host, self._foreign, self._at = machine.CpuWindow(), Foreign(), time.monotonic()
        self.shared.go.set()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stop_at_exit:
            self.shared.stop.set()
        self._publisher.join(self.seconds + 30)
        published = self._read("publisher.json")
        sent = published.get("sent", 0)
        deadline = time.monotonic() + self.settle
        while self.shared.received.value < sent and time.monotonic() < deadline:
            time.sleep(0.05)  # pacing: the receiver's counter
        time.sleep(0.1)  # its last tick's count
        server_cpu = {name: round(w.seconds(), 3) for name, w in self._cpu.items()}
        host_cpu = {**self._host.result(), "foreign_cores": self._foreign.cores()}
        window = round(time.monotonic() - self._at, 2)
        self._end()
        received = self._read("receiver.json")
        self.latencies = received.pop("latencies", [])
        got = received.get("received", 0)
        self.result = {
            "carrier": self.endpoint.carrier, "rate": self.rate, "sent": sent, "received": got,
            "lost": None if self.endpoint.carrier == PACING else max(0, sent - got),
            "latency_ms": wsload.percentiles(self.latencies),
            "publisher": published, "receiver": received, "server_cpu_seconds": server_cpu,
            "publisher_cpu_us_per_signal": per_unit_us(published.get("cpu_seconds", 0.0), sent),
            "receiver_cpu_us_per_signal": per_unit_us(received.get("cpu_seconds", 0.0), got),
            "server_cpu_us_per_signal": {k: per_unit_us(v, sent) for k, v in server_cpu.items()},
            "batch_mean": round(sent / published["round_trips"], 2) if published.get("round_trips") else None,
            "host_cpu": host_cpu, "window_seconds": window}

    def _end(self) -> None:
        self.shared.stop.set()
        self.shared.done.set()
        for p in (self._publisher, self._receiver):
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()

    def _read(self, name: str) -> dict:
        path = self._tmp / name
        return orjson.loads(path.read_bytes()) if path.exists() else {}


class Alone:
    """The ``alone`` phase's stand-in for a SignalLoad: the same CPU windows, no signals."""

    def __init__(self, servers: dict[str, list[int]]) -> None:
        self.servers = servers
        self.result: dict = {}
        self.latencies: list[float] = []

    def __enter__(self) -> Alone:
        self._cpu = {name: machine.ProcessCpu(pids) for name, pids in self.servers.items()}
        self._host, self._foreign, self._at = machine.CpuWindow(), Foreign(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.result = {"server_cpu_seconds": {name: round(w.seconds(), 3) for name, w in self._cpu.items()},
                       "host_cpu": {**self._host.result(), "foreign_cores": self._foreign.cores()},
                       "window_seconds": round(time.monotonic() - self._at, 2)}


# --- servers: Redis, Toxiproxy ------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """A private redis-server on a free port that saves nothing."""
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(folder), "--logfile", str(folder / "redis.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, 20, proc)
        yield proc, port
    finally:
        stop(proc)


def redis_version() -> str:
    out = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True).stdout
    return next((w.removeprefix("v=") for w in out.split() if w.startswith("v=")), out.strip())


@dataclass
class Toxi:
    proc: subprocess.Popen
    api: str
    version: str = ""
    listen: dict[str, int] = field(default_factory=dict)  # proxy name -> its port


@contextlib.contextmanager
def toxiproxy(upstreams: dict[str, int], ms_each_way: int) -> Iterator[Toxi]:
    """One toxiproxy-server, a proxy per upstream port, ``ms_each_way`` added to both directions."""
    from cluster.plan import Proxy
    from cluster.toxiproxy import Toxiproxy

    port = free_port()
    proc = subprocess.Popen([str(TOXIPROXY), "-host", "127.0.0.1", "-port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    toxi = Toxi(proc, f"http://127.0.0.1:{port}")
    try:
        wait_port(port, 20, proc)
        toxi.listen = {name: free_port() for name in upstreams}
        client = Toxiproxy(toxi.api)
        answer = client.version()  # {"version": "..."} from 2.6 on, plain text before
        toxi.version = str(orjson.loads(answer).get("version", answer)) if answer.startswith("{") else answer
        client.populate([Proxy(name, "bench", name, f"127.0.0.1:{toxi.listen[name]}", f"127.0.0.1:{up}")
                         for name, up in upstreams.items()])
        client.close()
        with httpx.Client(base_url=toxi.api, timeout=5) as http:
            for name in upstreams:
                for stream in ("upstream", "downstream"):
                    r = http.post(f"/proxies/{name}/toxics", json={
                        "name": f"latency_{stream}", "type": "latency", "stream": stream, "toxicity": 1.0,
                        "attributes": {"latency": ms_each_way, "jitter": 0}})
                    if r.status_code >= 400:
                        raise RuntimeError(f"toxiproxy: {r.status_code} {r.text}")
        yield toxi
    finally:
        stop(proc)


def make_signals_collection(mongo_url: str) -> None:
    from pymongo import MongoClient

    client: MongoClient = MongoClient(mongo_url)
    try:
        db = client[SIGNALS_DB]
        if SIGNALS_COLLECTION not in db.list_collection_names():
            db.create_collection(SIGNALS_COLLECTION, capped=True, size=1 << 20, max=SIGNALS_CAPPED_DOCS)
    finally:
        client.close()


# --- section 1: the carriers -----------------------------------------------------------------


def carriers_section(rate: float, seconds: float, rounds: int) -> dict:
    from harness.system import databases

    ctx = mp.get_context("spawn")
    base = Path(tempfile.mkdtemp(prefix="signals-carriers-"))
    runs: list[dict] = []
    pooled: dict[str, list[float]] = {}
    with databases(base / "dbs") as dbs, redis_server(base / "redis") as (redis_proc, redis_port):
        make_signals_collection(dbs.ferretdb.url)
        ferretdb_pid = machine.pid_of(dbs.ferretdb.proc)
        with toxiproxy({REDIS: redis_port, MONGO: dbs.ferretdb.port}, PROXY_MS_EACH_WAY) as toxi:
            toxi_version = toxi.version
            proxied_mongo = f"mongodb://127.0.0.1:{toxi.listen[MONGO]}/?directConnection=true"
            endpoints = {
                (REDIS, DIRECT): Endpoint(REDIS, redis=("127.0.0.1", redis_port)),
                (MONGO, DIRECT): Endpoint(MONGO, mongo_url=dbs.ferretdb.url),
                (REDIS, PROXIED): Endpoint(REDIS, redis=("127.0.0.1", toxi.listen[REDIS])),
                (MONGO, PROXIED): Endpoint(MONGO, mongo_url=proxied_mongo),
            }
            endpoints[(PACING, DIRECT)] = Endpoint(PACING)
            for k in range(rounds):
                order = list(CARRIERS) if k % 2 == 0 else list(reversed(CARRIERS))
                for link in (DIRECT, PROXIED):
                    for carrier in ([PACING] if link == DIRECT and k == 0 else []) + order:
                        servers = {"server": [redis_proc.pid if carrier != MONGO else ferretdb_pid]}
                        if link == PROXIED:
                            servers["toxiproxy"] = [toxi.proc.pid]
                        load = SignalLoad(ctx, endpoints[(carrier, link)], rate, seconds, servers,
                                          stop_at_exit=False, settle=0 if carrier == PACING else 5)
                        with load:
                            pass  # the publisher sends for ``seconds``; the exit waits for it
                        row = {"round": k, "link": link, **load.result}
                        runs.append(row)
                        pooled.setdefault(f"{carrier} {link}", []).extend(load.latencies)
                        lat = row["latency_ms"]
                        print(f"[signals] round {k} {carrier} {link}: {row['received']}/{row['sent']} received, "
                              f"p50/p99 {lat['p50']}/{lat['p99']} ms, publisher "
                              f"{row['publisher_cpu_us_per_signal']} µs/signal; other work "
                              f"{row['host_cpu']['foreign_cores']} cores", flush=True)
    summary = {}
    for name, values in pooled.items():
        carrier, link = name.split(" ")
        mine = [r for r in runs if r["carrier"] == carrier and r["link"] == link]
        sent = sum(r["sent"] for r in mine)
        summary[name] = {
            "carrier": carrier, "link": link, "sent": sent, "received": sum(r["received"] for r in mine),
            "latency_ms": wsload.percentiles(values),
            "publisher_cpu_us_per_signal": per_unit_us(sum(r["publisher"].get("cpu_seconds", 0) for r in mine), sent),
            "receiver_cpu_us_per_signal": per_unit_us(sum(r["receiver"].get("cpu_seconds", 0) for r in mine), sent),
            "server_cpu_us_per_signal": per_unit_us(sum(r["server_cpu_seconds"]["server"] for r in mine), sent),
            "batch_mean": [r["batch_mean"] for r in mine],
            "foreign_cores": [r["host_cpu"]["foreign_cores"] for r in mine],
            "tail_restarts": [r["receiver"].get("restarts") for r in mine] if carrier == MONGO else None}
    return {"what": f"one publisher at {rate:g} signals/s for {seconds:g} s, one receiver; publish -> receipt",
            "toxiproxy": toxi_version, "rate": rate, "seconds": seconds, "rounds": rounds,
            "proxy_ms_each_way": PROXY_MS_EACH_WAY,
            "summary": summary, "runs": runs}


# --- section 2: message delivery beside the signals ------------------------------------------


def relay_fall_offs(system: System) -> int:
    path = system.logdir / "relay.log"
    return path.read_text(errors="replace").count("event=oplog_fell_off") if path.exists() else 0


def delivery_section(clients: int, rate: float, signal_rate: float, seconds: float, rounds: int) -> dict:
    from harness.system import databases, running_system
    from loadtest.bench import AS_DEPLOYED, DEPLOYED_DAEMONS

    ctx = mp.get_context("spawn")
    base = Path(tempfile.mkdtemp(prefix="signals-delivery-"))
    runs: list[dict] = []
    with databases(base / "dbs") as dbs, redis_server(base / "redis") as (redis_proc, redis_port):
        make_signals_collection(dbs.ferretdb.url)
        endpoints = {REDIS: Endpoint(REDIS, redis=("127.0.0.1", redis_port)),
                     MONGO: Endpoint(MONGO, mongo_url=dbs.ferretdb.url)}
        with running_system(dbs, daemons=DEPLOYED_DAEMONS, **AS_DEPLOYED, CHAT_RATE_LIMIT_PER_SECOND="0",
                            CHAT_LOG_LEVEL="WARNING", CHAT_WRITER_QUEUE_MAX="50000",
                            CHAT_FERRETDB_TAIL_POLL_MS=f"{TAIL_POLL_MS:g}") as system:
            servers = {"ferretdb": [machine.pid_of(dbs.ferretdb.proc)], "redis": [redis_proc.pid],
                       "relay": [system.procs["relay"].pid],
                       "daemons": [p.pid for n, p in system.procs.items() if n.startswith("daemon")]}
            for k in range(rounds):
                for name in PHASES:
                    load: SignalLoad | Alone
                    if name == ALONE:
                        load = Alone(servers)
                    else:  # runs at most the send window and a little more; stopped when it ends
                        load = SignalLoad(ctx, endpoints[name], signal_rate, seconds + 5, servers, stop_at_exit=True)
                    falls = relay_fall_offs(system)
                    measured = wsload.run(system, clients, rate, seconds, progress=False, alongside=load)
                    row = {"round": k, "phase": name, "relay_fall_offs": relay_fall_offs(system) - falls,
                           "messages": {key: measured[key] for key in (
                               "clients", "held", "asked", "sent", "delivered", "lost", "duplicates", "send_errors",
                               "refused", "e2e_ms", "creation_ms", "stored_to_client_ms", "host_cpu")},
                           "signals": {key: v for key, v in load.result.items()
                                       if key not in ("server_cpu_seconds", "host_cpu", "window_seconds")},
                           "window": {"seconds": load.result["window_seconds"], **load.result["host_cpu"]},
                           "cpu_cores": {key: round(v / load.result["window_seconds"], 2)
                                         for key, v in load.result["server_cpu_seconds"].items()}}
                    runs.append(row)
                    e2e = measured["e2e_ms"]
                    sig = load.result.get("latency_ms", {})
                    print(f"[delivery] round {k} {name}: {measured['sent']} messages, p50/p99 {e2e['p50']}/{e2e['p99']}"
                          f" ms, lost {measured['lost']}; signals {load.result.get('received', '-')}/"
                          f"{load.result.get('sent', '-')} p50/p99 {sig.get('p50', '-')}/{sig.get('p99', '-')} ms; "
                          f"relay fall-offs {row['relay_fall_offs']}", flush=True)
    return {"what": f"{clients} WebSocket clients, {rate:g} msg/s through the API for {seconds:g} s per phase, "
                    f"as deployed ({AS_DEPLOYED['apis']} API processes, the writer, the relay, {DEPLOYED_DAEMONS} "
                    f"daemons); {signal_rate:g} signals/s beside them in the redis and mongo phases",
            "clients": clients, "rate": rate, "signal_rate": signal_rate, "seconds": seconds, "rounds": rounds,
            "deployed": {**AS_DEPLOYED, "daemons": DEPLOYED_DAEMONS}, "runs": runs, "ratios": delivery_ratios(runs)}


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 2) if known else None


def delivery_ratios(runs: list[dict]) -> dict:
    """Each signal phase's delivery p50 and p99 over the ``alone`` phase of the same round, and their mean."""
    out: dict[str, dict] = {}
    for name in (REDIS, MONGO):
        per_round = []
        for k in sorted({r["round"] for r in runs}):
            alone = next((r for r in runs if r["round"] == k and r["phase"] == ALONE), None)
            this = next((r for r in runs if r["round"] == k and r["phase"] == name), None)
            if alone and this:
                per_round.append({q: ratio(this["messages"]["e2e_ms"][q], alone["messages"]["e2e_ms"][q])
                                  for q in ("p50", "p99")})
        out[name] = {"per_round": per_round, **{f"{q}_mean": _mean([r[q] for r in per_round]) for q in ("p50", "p99")}}
    return out


# --- the table, the file ----------------------------------------------------------------------


def _fmt(v: object) -> str:
    return "–" if v is None else str(v)


def _ms(p: dict | None) -> str:
    return "–" if not p or p.get("p50") is None else f"{p['p50']:g}/{p['p99']:g}"


def table(result: dict) -> list[str]:
    lines = []
    carriers = result.get("carriers")
    if carriers:
        lines += [f"Signal latency, {carriers['rate']:g} signals/s for {carriers['seconds']:g} s, "
                  f"{carriers['rounds']} round(s) pooled:", "",
                  "| carrier | link | received/sent | p50/p99 ms | max ms | publisher µs/signal "
                  "| receiver µs/signal | server µs/signal | signals per round trip | other work's cores |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for s in carriers["summary"].values():
            lines.append(f"| {s['carrier']} | {s['link']} | {s['received']}/{s['sent']} | {_ms(s['latency_ms'])} "
                         f"| {_fmt(s['latency_ms']['max'])} | {s['publisher_cpu_us_per_signal']} "
                         f"| {s['receiver_cpu_us_per_signal']} | {s['server_cpu_us_per_signal']} "
                         f"| {', '.join(str(b) for b in s['batch_mean'])} "
                         f"| {', '.join(str(c) for c in s['foreign_cores'])} |")
        lines.append("")
    delivery = result.get("delivery")
    if delivery:
        lines += [f"Message delivery, {delivery['what']}:", "",
                  "| round | phase | messages delivered p50/p99 ms | lost | signals received/sent | signal p50/p99 ms "
                  "| FerretDB / relay / Redis cores | relay fall-offs | busy, steal | other work's cores |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in delivery["runs"]:
            m, s, host, cores = r["messages"], r["signals"], r["window"], r["cpu_cores"]
            got = f"{s['received']}/{s['sent']}" if "sent" in s else "–"
            lines.append(f"| {r['round']} | {r['phase']} | {_ms(m['e2e_ms'])} | {m['lost']} | {got} "
                         f"| {_ms(s.get('latency_ms'))} | {cores['ferretdb']} / {cores['relay']} / {cores['redis']} "
                         f"| {r['relay_fall_offs']} "
                         f"| {host['busy_pct']:g} %, {host['steal_pct']:g} % | {host['foreign_cores']} |")
        lines += ["", "| beside | delivery p50 / alone | delivery p99 / alone |", "|---|---|---|"]
        for name, q in delivery["ratios"].items():
            p50s, p99s = (", ".join(str(r[key]) for r in q["per_round"]) for key in ("p50", "p99"))
            lines.append(f"| {name} | {q['p50_mean']} ({p50s}) | {q['p99_mean']} ({p99s}) |")
    lines += ["", f"NATS: {result['nats']}"]
    return lines


def failure(result: dict) -> str | None:
    """Why the run's figures do not describe the load they name, or None."""
    problems = []
    for r in (result.get("delivery") or {}).get("runs", []):
        m = r["messages"]
        if m["lost"] or m["duplicates"]:
            problems.append(f"round {r['round']} {r['phase']}: {m['lost']} lost, {m['duplicates']} duplicated")
        if m["held"] < m["clients"] or m["sent"] < m["asked"] or m["refused"]:
            problems.append(f"round {r['round']} {r['phase']}: {m['held']}/{m['clients']} held, "
                            f"{m['sent']}/{m['asked']} stored")
    for r in (result.get("carriers") or {}).get("runs", []):
        if not r["sent"] or r["receiver"].get("error"):
            problems.append(f"{r['carrier']} {r['link']}: sent {r['sent']}, "
                            f"receiver error {r['receiver'].get('error')}")
    return "; ".join(problems) or None


def main(only: str = typer.Option("all", help="all, carriers or delivery"),
         signal_rate: float = typer.Option(1000.0, help="signals/s"),
         signal_seconds: float = typer.Option(10.0, help="each carrier run's window"),
         carrier_rounds: int = typer.Option(2, min=1, max=4, help="each carrier and link this many times, "
                                            "the order of the carriers alternated"),
         clients: int = typer.Option(1000, help="WebSocket clients in the delivery section"),
         rate: float = typer.Option(500.0, help="messages/s through the API in the delivery section"),
         seconds: float = typer.Option(10.0, help="each delivery phase's send window"),
         rounds: int = typer.Option(2, min=1, max=4, help="alone, redis, mongo, interleaved this many times"),
         publish: bool = typer.Option(False, "--publish", help="write loadtest/results/signals-carrier.json"),
         out: Path | None = typer.Option(None, help="the result JSON (default var/bench/signals-carrier.json)")
         ) -> None:
    """Signals through Redis pub/sub against through FerretDB's oplog; on private servers of its own."""
    if only not in ("all", "carriers", "delivery"):
        raise typer.BadParameter("all, carriers or delivery")
    started = time.monotonic()
    result: dict = {"machine": {**machine.describe(), "redis": redis_version()},
                    "what": "typing/presence signals: Redis pub/sub against a capped FerretDB collection read "
                            "from the oplog (docs/decisions/signals-over-redis.md)",
                    "nats": NATS}
    if only in ("all", "carriers"):
        result["carriers"] = carriers_section(signal_rate, signal_seconds, carrier_rounds)
    if only in ("all", "delivery"):
        result["delivery"] = delivery_section(clients, rate, signal_rate, seconds, rounds)
    result["wall_seconds"] = round(time.monotonic() - started)
    result["failed"] = failure(result)
    target = out or (OUT_PUBLISHED if publish else OUT_DEFAULT)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print("\n".join(table(result)))
    print(f"\nwrote {target} in {result['wall_seconds']} s")
    if result["failed"]:
        raise SystemExit(f"FAILED signals_carrier: {result['failed']}")


if __name__ == "__main__":
    typer.run(main)
