"""What typing indicators and presence cost (docs/presence.md), measured in one run.

`python -m loadtest.signals [--quick] [--publish]`: a private MariaDB, FerretDB
and Redis, the system as `make run` deploys it (the writer, the relay, the API
processes, the daemons), and N lean WebSocket clients (one user each) in
processes of their own, each of which sends a ``watch`` frame of W other users
after its hello (every snapshot is awaited). Then, on the same system and the
same connections:

- memory: the daemons' PSS (and RSS) growth per connection held, before any
  traffic (loadtest.receipts' method), without a watch list, then with one;
- phases alternated for ``--rounds`` rounds, so that the machine's drift weighs
  on each alike: ``typing`` (T typing refreshes a second, ``{"type": "typing",
  "to": peer, "state": "start"}`` from random clients to one of the users they
  watch, chosen at random; no client sends one peer two within ``PAIR_GAP``, so
  the daemons' throttle passes every one), ``messages`` (R msg/s posted through
  the API between random pairs, as loadtest.receipts posts them) and
  ``messages+typing`` (both at once). Typing latency = the frame sent -> the
  ``typing`` frame on the peer's socket (matched by from and to: a pair's frames
  answer its sends in order); message delivery = POST -> frame on the socket;
  CPU per signal = the daemons' (and Redis's) CPU time (/proc) over the window
  and its settling, over the typing frames sent;
- reconnect storms, one after the other (``--storms 1000,5000``): each time, the
  sockets of users 0 .. S-1 dropped at once (``abort``: no close frame) and all
  reconnected at once, each with its resume point; counted from the first drop
  to the grace and one ``last_seen`` store period after the last one is back:
  the rows of MySQL's ``presence`` whose ``last_seen`` changed, the changes
  published on the ``chat:presence:{user}`` channels (this process subscribes to
  them by pattern from before the first connection), the presence frames the watchers got, the commands Redis
  ran, and the users connected again whom Redis lists on no daemon.

Writes var/bench/signals.json, or with ``--publish``
loadtest/results/signals-latest.json and the generated section of
docs/benchmarks.md. The figures are FerretDB 1.24's (SQLite backend), MariaDB's
and Redis 7.0's on the one 2-core machine every process shares, not MongoDB's.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import orjson
import redis
import typer
from sqlalchemy import text
from websockets.frames import Frame, Opcode

from chat import auth
from chat.settings import Settings
from chat.signal_store import PRESENCE_PREFIX, online_key
from chatctl.client import Inbox
from daemon.signals import STORE_SECONDS
from loadtest import wsload
from loadtest.clients import lean as leanclient
from loadtest.clients import lean_processes
from loadtest.clients.lean_processes import kb_per_connection
from loadtest.clients.websocket import masked
from loadtest.common import machine
from loadtest.common.results import RESULTS, UNPUBLISHED
from loadtest.common.units import per_unit_us, ratio
from loadtest.report.signals_table import signals_table
from loadtest.report.write import write_result

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

    from sqlalchemy.engine import Engine

    from harness.system import System

TYPING_ALONE, MESSAGES, BOTH = "typing", "messages", "messages+typing"
PHASES = (TYPING_ALONE, MESSAGES, BOTH)
WITH_TYPING = (TYPING_ALONE, BOTH)
WITH_MESSAGES = (MESSAGES, BOTH)
STORM_PHASE = 100  # the phase index the first storm's records carry (the next one's 101, ...)
# What the client processes do: the mode the main process sets.
QUIET, TYPING, WATCHING, STORM = 0, 1, 2, 3
TEXT = 0x1
CLIENT_PROCS = 2  # the typists and the peers in two processes: no one event loop queues both ends of every signal
TICK = 0.02  # s between two looks of a client process at the mode (and two bursts of typing frames)
# s at least between two starts of one client to one peer: over the throttle's second with room for the
# frames' bunching on the way in (a daemon judges by when it reads them), as clients refresh (docs/presence.md: 2-3 s)
PAIR_GAP = 2.0
WATCH_WINDOW = 200  # watch frames awaiting their snapshot at a time (all processes): the daemons' pace, not a queue
WATCH_TRIES = 3  # a watch answered by an error frame is sent again, at most this many times in all
RETRIED_WATCH = "watch signals_unavailable"  # an error frame the clients answer by sending the watch again
WATCH_RETRY_SECONDS = 1.0  # ... this long after the error (a daemon that lost Redis says so for a second or two)
WATCH_LIMIT_SECONDS = 150.0  # the longest the snapshots are waited for
GRACE = float(Settings.field("signals.presence_grace_seconds").default)  # the harness runs the default
MEMORY_LIMIT_KB = 3.0  # docs/receipts.md: an idle connection (no watch list) stays at or under it
# Part of the brief this run leaves out, and why (the page says so beside the figures).
NOT_MEASURED = ("typing latency across hosts: bringing the cluster up (namespaces, its databases and Redis, three"
                " hosts, nginx) beside this run would not fit the run's few minutes on these 2 cores."
                " `tests/e2e/test_cluster_signals.py` checks typing from one host to another and a killed host's"
                " users turning offline.")
OUT_DEFAULT = UNPUBLISHED / "signals.json"
T0 = time.monotonic()  # the progress lines say when, from the start


def say(line: str) -> None:
    print(f"[signals {time.monotonic() - T0:.0f} s] {line}", flush=True)
OUT_PUBLISHED = RESULTS / "signals-latest.json"
RECEIPTS_PUBLISHED = RESULTS / "receipts-latest.json"


def user_name(prefix: str, index: int) -> str:
    return f"{prefix}{index}"


def watch_list(index: int, clients: int, size: int, seed: int = 7) -> list[int]:
    """The ``size`` users (indices) that user ``index`` of ``clients`` watches: distinct, never itself. Pure."""
    rng = random.Random(seed * 1_000_003 + index)
    return [j if j < index else j + 1 for j in rng.sample(range(clients - 1), min(size, clients - 1))]


@dataclass
class SignalsJob:
    prefix: str
    indices: list[int]  # the users of this process, by index
    clients: int  # all of them, every process
    watch: int  # users each one watches
    storm: int  # the largest storm: users 0 .. storm - 1 are dropped and reconnected in it
    typing_rate: float  # typing frames/s this process sends while typing is on
    watch_window: int  # watch frames this process keeps awaiting their snapshot
    host: str
    port: int
    secret: str
    source: str
    out: str


@dataclass
class SignalsShared:
    """What the main process and the client processes share: counters, the mode and the phase."""
    connected: Synchronized[int]  # first connections that got their hello
    reconnected: Synchronized[int]  # the storm's connections back with their hello
    snapshots: Synchronized[int]  # presence snapshot frames received
    watch_failed: Synchronized[int]  # watch frames given up on (their last try answered by an error frame)
    messages: Synchronized[int]  # message frames received
    frames: Synchronized[int]  # every frame received
    typing_sent: Synchronized[int]  # typing frames sent
    storm_size: Synchronized[int]  # users 0 .. storm_size - 1 are dropped in the storm under way
    mode: Synchronized[int]
    phase: Synchronized[int]  # index of the phase under way (-1: none), to tag what is measured
    stop: Event


class SignalsClients:
    """One client process's connections and what they saw and sent. Records are lists (JSON):
    typing sent ``[phase, from, to, at]``; typing seen on the peer's socket ``[from, to, at]``;
    presence changes ``[phase, user, online, at]``."""

    def __init__(self, job: SignalsJob, rng: random.Random | None = None) -> None:
        self.job = job
        self.rng = rng or random.Random(job.source)
        self.mode, self.phase = QUIET, -1
        self.users = [user_name(job.prefix, i) for i in job.indices]
        self.watches = {user_name(job.prefix, i): [user_name(job.prefix, j) for j in
                                                   watch_list(i, job.clients, job.watch)] for i in job.indices}
        self.latencies: dict[int, list[float]] = {}  # phase -> message delivery, s
        self.typing_sent: list[list] = []
        self.typing_seen: list[list] = []
        self.own_typing = 0  # typing frames on the typist's own socket: counted (there should be none)
        self.snapshots = self.snapshot_users = self.snapshot_online = 0
        self.changes: list[list] = []
        self.errors: list[dict] = []
        self.error_count = 0
        self.error_codes: dict[str, int] = {}  # "frame code" -> how many
        self.counted_messages = self.counted_frames = self.counted_snapshots = self.counted_typing = 0
        self.inboxes = {u: Inbox() for u in self.users}
        self.clients: dict[str, leanclient.LeanClient] = {}
        self.last_start: dict[tuple[str, str], float] = {}  # (typist, peer) -> monotonic time of its last start
        self.typing_origin: float | None = None  # when this typing run began (monotonic), and frames sent in it
        self.typing_done = 0
        self.to_watch = list(reversed(self.users))  # whose watch frame is still to go (popped from the end)
        self.watch_later: list[tuple[float, str]] = []  # (not before, monotonic; user): to send again
        self.watch_tries: dict[str, int] = {}
        self.watch_out = 0  # watch frames awaiting their answer
        self.watch_failed = self.counted_watch_failed = 0
        self.closed_at: dict[str, tuple[float, int]] = {}  # storm: user -> when its socket was dropped (wall clock), in
        # which storm
        self.gaps: dict[int, dict[str, float]] = {}  # storm phase -> user -> dropped -> hello again, s

    def on_frame(self, user: str, doc: dict, now: float) -> None:
        self.counted_frames += 1
        kind = doc.get("type")
        if kind == "message":
            self.counted_messages += 1
            self.latencies.setdefault(self.phase, []).append(now - float(doc["body"].split(" ", 1)[0]))
        elif kind == "typing":
            if doc.get("to") == user and doc.get("from") != user:
                self.typing_seen.append([doc["from"], user, now])
            else:
                self.own_typing += 1
        elif kind == "presence":
            if "users" in doc:
                self.watch_out -= 1
                self.counted_snapshots += 1
                self.snapshots += 1
                self.snapshot_users += len(doc["users"])
                self.snapshot_online += sum(1 for u in doc["users"] if u.get("online"))
            else:
                self.changes.append([self.phase, doc.get("user"), doc.get("online"), now])
        elif kind == "error":
            self.error_count += 1
            key = f"{doc.get('frame')} {doc.get('code')}"
            self.error_codes[key] = self.error_codes.get(key, 0) + 1
            if len(self.errors) < 100:
                self.errors.append({k: doc.get(k) for k in ("code", "message", "frame")})
            if doc.get("frame") == "watch":
                self.watch_out -= 1
                if self.watch_tries.get(user, 0) < WATCH_TRIES:
                    self.watch_later.append((time.monotonic() + WATCH_RETRY_SECONDS, user))
                else:
                    self.watch_failed += 1
                    self.counted_watch_failed += 1

    def _write(self, user: str, frame: bytes) -> bool:
        client = self.clients.get(user)
        if client is None or client.transport.is_closing():
            return False
        client.transport.write(frame)
        return True

    def send_watches(self, now: float) -> None:
        """Watch frames, as many as keep the job's window of them awaiting their snapshot; those
        answered by an error go again once their wait is over (``now``: monotonic)."""
        if self.watch_later and self.watch_later[0][0] <= now:
            due = [user for at, user in self.watch_later if at <= now]
            self.watch_later = [(at, user) for at, user in self.watch_later if at > now]
            self.to_watch.extend(reversed(due))
        while self.to_watch and self.watch_out < self.job.watch_window:
            user = self.to_watch.pop()
            self.watch_tries[user] = self.watch_tries.get(user, 0) + 1
            payload = orjson.dumps({"type": "watch", "users": self.watches[user]})
            if self._write(user, Frame(Opcode.TEXT, payload).serialize(mask=True)):
                self.watch_out += 1

    def start_typing(self) -> None:
        self.typing_origin, self.typing_done = None, 0

    def send_typing(self, now: float) -> None:
        """The typing frames due by ``now`` (monotonic) at the job's rate: each from a random user of
        this process to a random one of those it watches, never a pair again within ``PAIR_GAP``."""
        if self.typing_origin is None:
            self.typing_origin = now
        due = int((now - self.typing_origin) * self.job.typing_rate)
        rng, last = self.rng, self.last_start
        while self.typing_done < due:
            self.typing_done += 1
            for _try in range(20):
                user = rng.choice(self.users)
                peer = rng.choice(self.watches[user])
                if now - last.get((user, peer), -PAIR_GAP) >= PAIR_GAP:
                    break
            else:
                continue
            payload = orjson.dumps({"type": "typing", "to": peer, "state": "start"})
            at = time.time()
            if self._write(user, masked(TEXT, payload)):
                last[(user, peer)] = now
                self.typing_sent.append([self.phase, user, peer, at])
                self.counted_typing += 1

    def drop_storm(self, size: int) -> list[str]:
        """The sockets of users 0 .. ``size`` - 1, dropped at once (no close frame); returns those users."""
        dropped = []
        for index in self.job.indices:
            if index >= size:
                continue
            user = user_name(self.job.prefix, index)
            client = self.clients.pop(user, None)
            if client is None:
                continue
            self.closed_at[user] = (time.time(), self.phase)
            client.transport.abort()
            dropped.append(user)
        return dropped


async def _clients(job: SignalsJob, shared: SignalsShared) -> None:
    side = SignalsClients(job)
    failures = {"connect": 0, "storm": 0}
    # Handshakes in flight (each holds its slot until its hello): the first connections stay under somaxconn;
    # the storm's all go at once, as many devices would (a slot held until the hello would queue the later
    # ones behind the earlier ones' catch-up reads, and their presence with them).
    gates = {"connect": asyncio.Semaphore(200), "storm": asyncio.Semaphore(max(1, job.storm))}

    async def one(user: str, counter: Synchronized[int], what: str) -> None:
        client = await lean_processes.connect_retrying(
            gates[what], job.host, job.port, auth.mint(job.secret, user, 7200), side.inboxes[user],
            lambda doc, now: side.on_frame(user, doc, now), job.source)
        if client is None:
            failures[what] += 1
            return
        side.clients[user] = client
        if user in side.closed_at:
            dropped_at, phase = side.closed_at.pop(user)
            side.gaps.setdefault(phase, {})[user] = time.time() - dropped_at
        lean_processes.count(counter)

    tasks = [asyncio.create_task(one(u, shared.connected, "connect")) for u in side.users]
    stormed_for = typing_for = -1
    while not shared.stop.is_set():
        await asyncio.sleep(TICK)
        mode, phase = shared.mode.value, shared.phase.value
        side.mode, side.phase = mode, phase
        now = time.monotonic()
        if mode == WATCHING:
            side.send_watches(now)
        elif mode == TYPING:
            if typing_for != phase:
                side.start_typing()
                typing_for = phase
            side.send_typing(now)
        elif mode == STORM and stormed_for != phase:
            stormed_for = phase
            dropped = side.drop_storm(shared.storm_size.value)
            tasks += [asyncio.create_task(one(u, shared.reconnected, "storm")) for u in dropped]
        if side.counted_frames or side.counted_typing:  # shared counters: one lock each per tick, not per frame
            for counter, n in ((shared.frames, side.counted_frames), (shared.messages, side.counted_messages),
                               (shared.snapshots, side.counted_snapshots), (shared.typing_sent, side.counted_typing),
                               (shared.watch_failed, side.counted_watch_failed)):
                if n:
                    lean_processes.count(counter, n)
            side.counted_frames = side.counted_messages = side.counted_snapshots = side.counted_typing = 0
            side.counted_watch_failed = 0
    await lean_processes.close_and_write(
        job.out, side.inboxes, side.clients, tasks, failures["connect"],
        latencies={str(k): v for k, v in side.latencies.items()},
        typing_sent=side.typing_sent, typing_seen=side.typing_seen, own_typing=side.own_typing,
        snapshots=side.snapshots, snapshot_users=side.snapshot_users, snapshot_online=side.snapshot_online,
        watch_failed=side.watch_failed, watch_retries=sum(side.watch_tries.values()) - len(side.watch_tries),
        changes=side.changes, errors=side.errors, error_count=side.error_count, error_codes=side.error_codes,
        storm_failures=failures["storm"], gaps={str(k): v for k, v in side.gaps.items()})


# --- pure: what the records say (tests/core/test_signals_bench.py) -----------------------


def typing_latencies(sent: Iterable[list], seen: Iterable[list]) -> tuple[dict[int, list[float]], dict[str, int]]:
    """({phase: [typing frame sent -> on the peer's socket, s]}, counts). One pair's frames keep
    their order all the way (one socket, one daemon's publishing queue, one Redis channel, one
    subscriber), so the k-th ``typing`` frame from A on B's socket answers A's k-th start to B:
    the earliest one not yet answered, sent before the frame arrived. Counts: ``matched`` sends,
    ``missing`` (sent, never seen) and ``unmatched`` (seen, answering no send)."""
    by_pair: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for phase, sender, to, at in sent:
        by_pair.setdefault((sender, to), []).append((at, phase))
    for sends in by_pair.values():
        sends.sort()
    out: dict[int, list[float]] = {}
    answered: dict[tuple[str, str], int] = {}  # pair -> how many of its sends are answered (the first ones)
    unmatched = 0
    for sender, to, at in sorted(seen, key=lambda s: s[2]):
        pair = (sender, to)
        sends, k = by_pair.get(pair, []), answered.get(pair, 0)
        if k >= len(sends) or sends[k][0] > at:
            unmatched += 1
            continue
        answered[pair] = k + 1
        sent_at, phase = sends[k]
        out.setdefault(phase, []).append(at - sent_at)
    matched = sum(answered.values())
    total = sum(len(v) for v in by_pair.values())
    return out, {"matched": matched, "missing": total - matched, "unmatched": unmatched}


def combine(rounds: list[dict], idle_daemon_cores: float) -> dict:
    """One phase's rounds as one row: latencies pooled, CPU summed, then per signal and per message."""
    signals = sum(r["typing_sent"] for r in rounds)
    messages = sum(r["sent"] for r in rounds)
    window = sum(r["window_seconds"] for r in rounds)
    cpu = {name: sum(r["cpu_seconds"][name] for r in rounds) for name in rounds[0]["cpu_seconds"]}
    net_daemons = cpu["daemons"] - idle_daemon_cores * window
    send = sum(r["send_seconds"] for r in rounds)
    return {
        "rounds": len(rounds), "typing_sent": signals, "messages": messages, "window_seconds": round(window, 1),
        "posted_per_s": round(messages / send, 1) if messages and send else None,
        "typing_ms": wsload.percentiles([v for r in rounds for v in r["typing_latencies"]]),
        "message_ms": wsload.percentiles([v for r in rounds for v in r["latencies"]]),
        "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
        "cpu_us_per_signal": {name: per_unit_us(s, signals) for name, s in cpu.items()} if signals else {},
        "daemons_net_us_per_signal": per_unit_us(net_daemons, signals),
        "cpu_us_per_message": {name: per_unit_us(s, messages) for name, s in cpu.items()} if messages else {},
        "steal_pct": [r["host_cpu"]["steal_pct"] for r in rounds],
        "busy_pct": [r["host_cpu"]["busy_pct"] for r in rounds],
    }


def ratios(phases: dict[str, dict]) -> dict:
    """Messages beside typing over messages alone, and typing beside messages over typing alone: one run."""
    m, b, t = phases[MESSAGES], phases[BOTH], phases[TYPING_ALONE]
    return {
        "message_p50": ratio(b["message_ms"]["p50"], m["message_ms"]["p50"]),
        "message_p99": ratio(b["message_ms"]["p99"], m["message_ms"]["p99"]),
        "typing_p50": ratio(b["typing_ms"]["p50"], t["typing_ms"]["p50"]),
        "typing_p99": ratio(b["typing_ms"]["p99"], t["typing_ms"]["p99"]),
        **{f"cpu_{proc}": ratio(b["cpu_seconds"][proc] / max(b["window_seconds"], 1e-9),
                                m["cpu_seconds"][proc] / max(m["window_seconds"], 1e-9))
           for proc in ("daemons", "redis", "writer", "relay", "apis")},
    }


def marginal_us_per_signal(phases: dict[str, dict], proc: str = "daemons") -> float | None:
    """What typing added to ``proc``'s CPU beside the messages, per signal: the CPU rate of
    messages+typing less that of messages alone, over the windows of messages+typing."""
    m, b = phases[MESSAGES], phases[BOTH]
    if not b["typing_sent"] or not m["window_seconds"]:
        return None
    extra = b["cpu_seconds"][proc] - m["cpu_seconds"][proc] / m["window_seconds"] * b["window_seconds"]
    return per_unit_us(extra, b["typing_sent"])


def changed_rows(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The users whose ``last_seen`` differs (or who have a row only after). Pure."""
    return sorted(u for u, seen in after.items() if before.get(u) != seen)


# --- the run ---------------------------------------------------------------------------------


class PresenceFeed:
    """This process's own subscription to every ``chat:presence:{user}`` (one pattern): each change
    with its time (a thread)."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(PRESENCE_PREFIX + "*")
        self.seen: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="presence-feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.pubsub.get_message(timeout=0.2)
            if message is not None:
                data = message["data"]
                self.seen.append((time.time(), data.decode() if isinstance(data, bytes) else str(data)))

    def between(self, start: float, end: float) -> list[str]:
        return [data for at, data in list(self.seen) if start <= at <= end]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.pubsub.close()
        self.client.close()


def redis_commands(client: redis.Redis) -> dict[str, int]:
    """Commands Redis has run, in all and by name (INFO commandstats)."""
    stats = client.info("commandstats")
    out = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items() if isinstance(v, dict)}
    out["all"] = int(client.info("stats")["total_commands_processed"])
    return out


def last_seen_rows(engine: Engine) -> dict[str, object]:
    with engine.connect() as conn:
        return {u: str(s) for u, s in conn.execute(text("SELECT user, last_seen FROM presence")).all()}


def daemon_signal_counters(daemon_port: int, daemons: int, tries: int = 40) -> dict[str, float]:
    """``chat_daemon_signals_total`` by kind and outcome, and the typing frames written, summed over the
    daemons behind the shared port (a new connection each try: SO_REUSEPORT picks one)."""
    by_pid: dict[str, dict[str, float]] = {}
    for _ in range(tries):
        try:
            with httpx.Client(timeout=10) as c:
                body = c.get(f"http://127.0.0.1:{daemon_port}/metrics", headers={"Connection": "close"}).text
        except httpx.HTTPError:
            continue
        pid = next((line.split('"')[1] for line in body.splitlines() if line.startswith("chat_daemon_info{")), "?")
        by_pid[pid] = {name: float(value) for name, value in
                       (line.rsplit(" ", 1) for line in body.splitlines()
                        if line.startswith(("chat_daemon_signals_total{", "chat_daemon_signal_frames_total ")))}
        if len(by_pid) >= daemons:
            break
    total: dict[str, float] = {}
    for counters in by_pid.values():
        for name, value in counters.items():
            total[name] = total.get(name, 0.0) + value
    return {**total, "daemons_read": len(by_pid)}


def _wait_count(counter: Synchronized[int], want: int, limit: float) -> float:
    started = time.monotonic()
    while counter.value < want and time.monotonic() - started < limit:
        time.sleep(0.05)
    return time.monotonic() - started


@dataclass
class Rig:
    """What every phase measures with: the system, the shared counters, the processes' pids."""
    system: System
    shared: SignalsShared
    procs: dict[str, list[int]]
    expected: dict[str, list[int]]
    prefix: str


def one_phase(rig: Rig, index: int, name: str, rate: float, seconds: float) -> dict:
    shared = rig.shared
    shared.phase.value, shared.mode.value = index, QUIET
    time.sleep(0.2)  # every client process has read it (they look every 20 ms)
    cpu = {k: machine.ProcessCpu(pids) for k, pids in rig.procs.items()}
    host = machine.CpuWindow()
    started = time.monotonic()
    typing_before, messages_before = shared.typing_sent.value, shared.messages.value
    stop_typing = threading.Timer(seconds, lambda: setattr(shared.mode, "value", QUIET))
    if name in WITH_TYPING:
        shared.mode.value = TYPING
        stop_typing.start()  # after the send window, whether or not the POSTs are all answered by then
    sent_expected: dict[str, list[int]] = {}
    creation: list[float] = []
    send_errors, refused = 0, list[str]()
    if name in WITH_MESSAGES:
        sent_expected, creation, send_errors, refused = asyncio.run(wsload._send(
            rig.system.api_url, rig.system.secret, list(rig.expected), rate, seconds, False, seed=index + 1))
    else:
        time.sleep(seconds)
    send_seconds = time.monotonic() - started
    if stop_typing.is_alive():
        stop_typing.join()
    shared.mode.value = QUIET
    typing_sent = shared.typing_sent.value - typing_before
    want = messages_before + sum(len(v) for v in sent_expected.values())
    settled = lean_processes.wait_quiet(shared.frames, shared.messages, want, 1.0 if name == TYPING_ALONE else 2.0, 30)
    window = time.monotonic() - started
    cpu_seconds = {k: round(w.seconds(), 3) for k, w in cpu.items()}
    for user, ids in sent_expected.items():
        rig.expected[user].extend(ids)
    sent = len(creation)
    say(f"{name} (phase {index}): {typing_sent} typing frames, {sent} messages in {send_seconds:.1f} s, "
          f"settled in {settled:.1f} s; daemons {cpu_seconds['daemons']:.2f} s CPU"
          + (f", {per_unit_us(cpu_seconds['daemons'], typing_sent)} µs/signal" if typing_sent else ""))
    return {"name": name, "index": index, "typing_sent": typing_sent, "sent": sent,
            "asked": int(rate * seconds) if name in WITH_MESSAGES else 0, "send_errors": send_errors,
            "refused": refused[:3], "creation_ms": wsload.percentiles(creation), "send_seconds": round(send_seconds, 2),
            "settle_seconds": round(settled, 1),
            "window_seconds": round(window, 2), "cpu_seconds": cpu_seconds, "host_cpu": host.result()}


def storm(rig: Rig, engine: Engine, feed: PresenceFeed, count: int, phase: int) -> dict:
    """Drops ``count`` clients' sockets at once and reconnects them at once; what it changed."""
    shared, system = rig.shared, rig.system
    assert system.dbs.redis is not None
    client = redis.Redis.from_url(system.dbs.redis.url)
    rows_before = last_seen_rows(engine)
    commands_before = redis_commands(client)
    cpu = {k: machine.ProcessCpu(rig.procs[k]) for k in ("daemons", "redis", "clients")}
    reconnected_before = shared.reconnected.value
    started_wall, started = time.time(), time.monotonic()
    shared.storm_size.value = count
    shared.phase.value, shared.mode.value = phase, STORM
    back_in = _wait_count(shared.reconnected, reconnected_before + count, 60 + count / 100)
    back = shared.reconnected.value - reconnected_before
    shared.mode.value = QUIET
    # Users whose grace ran out turn offline within a tick of it, and last_seen goes to MySQL
    # within a store period: wait both, and some, after the last one is back.
    time.sleep(GRACE + STORE_SECONDS + 2.0)
    ended_wall = time.time()
    cpu_seconds = {k: round(w.seconds(), 3) for k, w in cpu.items()}
    commands_after = redis_commands(client)
    rows_after = last_seen_rows(engine)
    # Every client is connected again by now: each user must be online in Redis (a daemon in its set).
    with client.pipeline(transaction=False) as pipe:
        for user in rig.expected:
            pipe.exists(online_key(user))
        offline = [user for user, on in zip(rig.expected, pipe.execute(), strict=True) if not on]
    client.close()
    published = feed.between(started_wall, ended_wall)
    changed = changed_rows(rows_before, rows_after)
    storm_users = {user_name(rig.prefix, i) for i in range(count)}
    offline_by_user: dict[str, int] = {}
    for payload in published:
        if payload.startswith("0 "):
            user = payload.split()[1]
            offline_by_user[user] = offline_by_user.get(user, 0) + 1
    say(f"storm of {count}: back in {back_in:.1f} s; {len(changed)} last_seen rows changed, "
        f"{len(published)} presence changes published, {len(offline)} connected users offline in Redis")
    return {"phase": phase, "clients": count, "back": back, "back_seconds": round(back_in, 2),
            "observed_seconds": round(time.monotonic() - started, 1),
            "last_seen_changed": len(changed), "last_seen_changed_outside_storm": len(set(changed) - storm_users),
            "changed_users": changed,
            "offline_while_connected": len(offline), "offline_while_connected_sample": offline[:10],
            "presence_rows_before": len(rows_before),
            "published": len(published), "published_offline": sum(1 for p in published if p.startswith("0 ")),
            "published_online": sum(1 for p in published if p.startswith("1 ")), "published_sample": published[:10],
            "users_published_offline": len(offline_by_user),
            "users_published_offline_twice": sum(1 for n in offline_by_user.values() if n > 1),
            "redis_commands": {k: commands_after.get(k, 0) - commands_before.get(k, 0)
                               for k in ("all", "evalsha", "eval", "publish", "exists", "zadd")
                               if commands_after.get(k, 0) - commands_before.get(k, 0)},
            "cpu_seconds": cpu_seconds}


def run(system: System, clients: int, watch: int, typing_rate: float, rate: float, seconds: float, rounds: int,
        storms: list[int], watch_window: int = WATCH_WINDOW) -> dict:
    from db.sql import make_engine

    assert system.dbs.redis is not None and system.dbs.redis.proc is not None
    daemon_pids = [p.pid for n, p in system.procs.items() if n.startswith("daemon")]
    prefix = f"sg{clients}-"
    users = [user_name(prefix, i) for i in range(clients)]
    nprocs = max(CLIENT_PROCS, -(-clients // wsload.CLIENTS_PER_PROC))
    tmp = Path(tempfile.mkdtemp(prefix="signals-"))
    ctx = mp.get_context("spawn")
    shared = SignalsShared(ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("i", 0),
                           ctx.Value("l", 0), ctx.Value("l", 0), ctx.Value("l", 0), ctx.Value("i", 0),
                           ctx.Value("i", QUIET), ctx.Value("i", -1), ctx.Event())
    host, port = lean_processes.ws_host_port(system.ws_url)
    feed = PresenceFeed(system.dbs.redis.url)
    jobs = [SignalsJob(prefix, list(range(k, clients, nprocs)), clients, watch, max(storms), typing_rate / nprocs,
                       max(1, watch_window // nprocs), host, port, system.secret, lean_processes.source_address(k),
                       str(tmp / f"c{k}.json"))
            for k in range(nprocs)]
    procs = lean_processes.ClientProcesses(_clients, jobs, shared, shared.stop)
    connect_wall = time.time()
    connected = lean_processes.hold_connections(procs, shared.connected, clients, daemon_pids)
    held = connected.held
    online_published = len(feed.between(connect_wall, time.time()))
    say(f"{connected.line()}; {online_published} online changes published")
    shared.mode.value = WATCHING
    watch_started = time.monotonic()
    while (shared.snapshots.value + shared.watch_failed.value < held
           and time.monotonic() - watch_started < WATCH_LIMIT_SECONDS):
        time.sleep(0.05)
    watch_seconds = time.monotonic() - watch_started
    snapshots = shared.snapshots.value
    shared.mode.value = QUIET
    time.sleep(lean_processes.HELD_SETTLE_SECONDS)
    pss_watched, rss_watched = lean_processes.daemon_memory(daemon_pids)
    pss_idle, rss_idle = connected.idle
    say(f"{snapshots}/{held} snapshots in {watch_seconds:.1f} s; daemons' PSS "
        f"{kb_per_connection(pss_idle, pss_watched, held)} KB per connection with {watch} watched")
    idle = machine.ProcessCpu(daemon_pids)
    time.sleep(3.0)
    idle_cores = idle.cores()
    rig = Rig(system, shared, {
        "daemons": daemon_pids, "redis": [system.dbs.redis.proc.pid], "writer": [system.procs["writer"].pid],
        "relay": [system.procs["relay"].pid], "apis": [p.pid for n, p in system.procs.items() if n.startswith("api")],
        "clients": procs.pids(), "sender": [os.getpid()]}, {u: [] for u in users}, prefix)
    engine = make_engine(system.dbs.mariadb.url(), 30)
    done: list[dict] = []
    stormed: list[dict] = []
    try:
        for _round in range(rounds):
            for name in PHASES:
                done.append(one_phase(rig, len(done), name, rate, seconds))
        pss_after = lean_processes.daemon_memory(daemon_pids)[0]
        counters = daemon_signal_counters(system.daemon_port, len(daemon_pids))
        for k, size in enumerate(storms):
            stormed.append(storm(rig, engine, feed, min(size, held), STORM_PHASE + k))
    finally:
        procs.stop()
        engine.dispose()
        feed.close()
    return summarize(done, procs.results(), rig.expected, stormed, {
        **connected.figures(),
        "watch": watch, "snapshots": snapshots, "watch_seconds": round(watch_seconds, 1),
        "snapshots_per_s": round(snapshots / watch_seconds, 1) if watch_seconds else None,
        "watch_failed": shared.watch_failed.value,
        "pss_kb_per_conn_watching": kb_per_connection(pss_idle, pss_watched, held),
        "rss_kb_per_conn_watching": kb_per_connection(rss_idle, rss_watched, held),
        "pss_kb_per_watch_list": kb_per_connection(connected.settled[0], pss_watched, held),
        "pss_kb_per_conn_after_phases": kb_per_connection(pss_idle, pss_after, held)}, {
        "online_published_at_connect": online_published, "idle_daemon_cores": idle_cores,
        "daemon_counters": counters})


def receipts_memory() -> dict | None:
    """The published receipts run's memory figure, for the comparison (same method, an older run)."""
    if not RECEIPTS_PUBLISHED.exists():
        return None
    r = orjson.loads(RECEIPTS_PUBLISHED.read_bytes())
    return {"pss_kb_per_conn": r["memory"]["pss_kb_per_conn"], "rss_kb_per_conn": r["memory"]["rss_kb_per_conn"],
            "held": r["memory"]["held"], "commit": r["machine"]["commit"], "date": r["machine"]["date"]}


def storm_row(stormed: dict, outs: list[dict]) -> dict:
    """One storm's figures, with what the clients saw of it: each user's drop -> hello again, and the
    presence frames the watchers got while it lasted."""
    phase = stormed["phase"]
    gap_of = {u: g for o in outs for u, g in o["gaps"].get(str(phase), {}).items()}
    gaps = list(gap_of.values())
    changed = stormed.pop("changed_users", [])
    return {
        **stormed, "gap_ms": wsload.percentiles(gaps), "gaps_over_grace": sum(1 for g in gaps if g > GRACE),
        # the grace's own check: a user back within it (as the client saw it) must keep its last_seen
        "changed_back_within_grace": sum(1 for u in changed if gap_of.get(u, GRACE + 1) <= GRACE),
        "changed_back_after_grace": sum(1 for u in changed if gap_of.get(u, 0) > GRACE),
        "grace_seconds": GRACE, "presence_frames_to_watchers": sum(1 for o in outs for c in o["changes"]
                                                                   if c[0] == phase)}


def summarize(done: list[dict], outs: list[dict], expected: dict[str, list[int]], stormed: list[dict],
              memory: dict, extra: dict) -> dict:
    """The phases' records (main process) and the clients' files as the result."""
    sent = [s for o in outs for s in o["typing_sent"]]
    seen = [s for o in outs for s in o["typing_seen"]]
    typing, typing_counts = typing_latencies(sent, seen)
    latencies: dict[int, list[float]] = {}
    for o in outs:
        for k, v in o["latencies"].items():
            latencies.setdefault(int(k), []).extend(v)
    for d in done:
        d["latencies"] = latencies.get(d["index"], [])
        d["typing_latencies"] = typing.get(d["index"], [])
    idle = extra["idle_daemon_cores"]
    phases = {name: combine([d for d in done if d["name"] == name], idle) for name in PHASES}
    received: dict[str, list[int]] = {}
    for o in outs:
        received.update(o["received"])
    lost = sum(len(set(ids) - set(received.get(u, []))) for u, ids in expected.items())
    dups = sum(o["duplicates"] for o in outs) + sum(len(v) - len(set(v)) for v in received.values())
    other_changes = [c for o in outs for c in o["changes"] if c[0] < STORM_PHASE]
    snapshot_users = sum(o["snapshot_users"] for o in outs)
    result = {
        "what": "typing and presence: typing latency and CPU per signal, memory per connection with and without a"
                " watch list, message delivery beside typing, a reconnect storm; one run on one system",
        "memory": {**memory, "limit_kb": MEMORY_LIMIT_KB, "within_limit": memory["pss_kb_per_conn"] <= MEMORY_LIMIT_KB
                   and memory["rss_kb_per_conn"] <= MEMORY_LIMIT_KB, "receipts_published": receipts_memory(),
                   "snapshot_online_share": round(sum(o["snapshot_online"] for o in outs) / snapshot_users, 4)
                   if snapshot_users else None},
        "phases": phases, "ratios": ratios(phases),
        "marginal_us_per_signal": {p: marginal_us_per_signal(phases, p) for p in ("daemons", "redis")},
        "idle_daemon_cores": idle,
        "typing": {"sent": len(sent), **typing_counts, "own_socket": sum(o["own_typing"] for o in outs),
                   "all_ms": wsload.percentiles([v for vs in typing.values() for v in vs])},
        "daemon_counters": extra["daemon_counters"],
        "online_published_at_connect": extra["online_published_at_connect"],
        "storms": [storm_row(x, outs) for x in stormed], "storm_failures": sum(o["storm_failures"] for o in outs),
        "presence_frames_outside_storms": len(other_changes),
        "sent": sum(d["sent"] for d in done), "asked": sum(d["asked"] for d in done),
        "send_errors": sum(d["send_errors"] for d in done), "refused": [x for d in done for x in d["refused"]],
        "lost": lost, "duplicates": dups,
        "error_frames": [e for o in outs for e in o["errors"]][:20],
        "error_frame_count": sum(o["error_count"] for o in outs),
        "error_codes": merged_counts(o["error_codes"] for o in outs),
        "connect_failures": sum(o["failures"] for o in outs), "closed": sum(o["closed"] for o in outs),
        "close_codes": sorted({c for o in outs for c in o["close_codes"]}),
        "runs": [{k: v for k, v in d.items() if k not in ("latencies", "typing_latencies")} for d in done],
    }
    result["failed"] = failure(result)
    return result


def merged_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in counts:
        for k, n in c.items():
            out[k] = out.get(k, 0) + n
    return dict(sorted(out.items()))


def failure(result: dict) -> str | None:
    """Why the run's figures do not describe the load they name, or None."""
    problems = []
    mem = result["memory"]
    if result["lost"] or result["duplicates"]:
        problems.append(f"{result['lost']} messages lost, {result['duplicates']} duplicated")
    if mem["held"] < mem["clients"] or result["connect_failures"]:
        problems.append(f"{mem['held']}/{mem['clients']} held")
    if mem["snapshots"] < mem["held"]:
        problems.append(f"{mem['snapshots']}/{mem['held']} watch snapshots")
    if result["sent"] < result["asked"] or result["refused"]:
        problems.append(f"{result['sent']} of {result['asked']} messages stored")
    t = result["typing"]
    if t["missing"] or t["unmatched"] or t["own_socket"]:
        problems.append(f"typing: {t['missing']} of {t['sent']} never arrived, {t['unmatched']} unmatched, "
                        f"{t['own_socket']} on the typist's socket")
    # A watch answered signals_unavailable (its daemon had lost Redis for a moment) is sent again and
    # counted apart; any other error frame, or a watch given up, is the run's failure.
    others = {k: n for k, n in result["error_codes"].items() if k != RETRIED_WATCH}
    if others or mem.get("watch_failed"):
        problems.append(f"error frames {others}, {mem.get('watch_failed')} watch lists given up")
    if result["closed"]:
        problems.append(f"{result['closed']} connections closed (codes {result['close_codes']})")
    for s in result["storms"]:
        if s["back"] < s["clients"]:
            problems.append(f"storm of {s['clients']}: {s['back']} back")
        if s["offline_while_connected"]:
            problems.append(f"after the storm of {s['clients']}, {s['offline_while_connected']} connected users read"
                            " as offline in Redis")
    if result["storm_failures"]:
        problems.append(f"{result['storm_failures']} reconnections failed in the storms")
    return "; ".join(problems) or None


def main(clients: int = typer.Option(10_000, help="WebSocket clients, one user each"),
         watch: int = typer.Option(50, help="users each client watches"),
         typing_rate: float = typer.Option(1000.0, help="typing frames/s from the clients while typing is on"),
         rate: float = typer.Option(1000.0, help="messages/s posted through the API in the message phases"),
         seconds: float = typer.Option(10.0, help="each phase's send window"),
         rounds: int = typer.Option(3, min=1, max=10, help="typing, messages, messages+typing, alternated"),
         storms: str = typer.Option("1000,5000", help="reconnect storms, one after the other: the clients dropped and "
                                    "reconnected at once in each"),
         watch_window: int = typer.Option(WATCH_WINDOW, help="watch frames awaiting their snapshot at a time"),
         quick: bool = typer.Option(False, "--quick",
                                    help="2,000 clients, 500 msg/s, 6 s phases, one round, one storm of 1,000"),
         publish: bool = typer.Option(False, "--publish",
                                      help="write loadtest/results/signals-latest.json and the page's tables"),
         out: Path | None = typer.Option(None, help=f"the result JSON (default {OUT_DEFAULT})")) -> None:
    """One run on a private system of its own, deployed as `make run` deploys it."""
    from harness.system import databases, running_system
    from loadtest.bench import AS_DEPLOYED, DEPLOYED_DAEMONS

    if quick:
        clients, rate, seconds, rounds, storms = 2000, 500.0, 6.0, 1, "1000"
    sizes = [int(n) for n in storms.split(",")]
    params = {"clients": clients, "watch": watch, "typing_rate": typing_rate, "rate": rate,
              "seconds_per_phase": seconds, "rounds": rounds, "storms": sizes,
              "watch_window": watch_window, "grace_seconds": GRACE, "pair_gap_seconds": PAIR_GAP}
    started = time.monotonic()
    with databases(Path(tempfile.mkdtemp(prefix="signals-dbs-"))) as dbs:
        with running_system(dbs, daemons=DEPLOYED_DAEMONS, **AS_DEPLOYED, CHAT_RATE_LIMIT_PER_SECOND="0",
                            CHAT_LOG_LEVEL="WARNING", CHAT_WRITER_QUEUE_MAX="50000") as system:
            measured = run(system, clients, watch, typing_rate, rate, seconds, rounds, sizes, watch_window)
    result = {"machine": {**machine.describe(), "redis": redis_version()}, "parameters": params,
              "deployed": {**AS_DEPLOYED, "daemons": DEPLOYED_DAEMONS},
              "wall_seconds": round(time.monotonic() - started), **measured, "not_measured": NOT_MEASURED}
    write_result(result, out or (OUT_PUBLISHED if publish else OUT_DEFAULT), signals_table, publish, "signals")


def redis_version() -> str:
    import subprocess

    try:
        answer = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "Redis"
    version = next((w.removeprefix("v=") for w in answer.split() if w.startswith("v=")), "")
    return f"Redis {version}".strip()


if __name__ == "__main__":
    typer.run(main)
