"""Offline push (docs/push.md) under load, measured in one run.

`python -m loadtest.push [--quick] [--publish]`: a private MariaDB and FerretDB,
the system as `make run` deploys it (the writer, the relay, the API processes,
the daemons) plus the pusher, and a push gateway of our own in its own
process (harness/push_gateway.py), which records every notification it takes
with its arrival time. N users (one device each):

- the **online** half hold a WebSocket (``/v1/ws?device=ws``) and ack every
  message frame they receive (``{"type": "ack", "upto": id}``); they register
  no device for push;
- the **offline** half hold no socket and have one registered device each
  (``POST /v1/devices``, device ``phone``).

Messages are posted through the API between random pairs at R msg/s, in three
phases of the same length on the same system: ``normal`` (the gateway answers
200), then, once every push of it has arrived, ``outage`` (the gateway answers
500, or holds every request with ``--outage stall``, for the phase's whole send
window) and ``recovery`` right after it (200 again, while the pusher retries
what the outage refused). Then it waits, bounded, until the pusher has decided
every message and its outbox is empty.

Checked after the run, from MySQL, with the pusher's rule written out again
here (not imported): the **expected set** is, for each user with a registered
device, the messages of their partition's stream past the pusher's first
position and up to its last (``push_state``) that are messages (not events,
not deleted), addressed to them by someone else, above the highest position
any of their devices acknowledged (``device_acks``) and above their read
marker for the sender (``read_markers``). Notifications coalesce (one per
device per decision, for the newest message of the window), so the match is:

- every expected message ``m`` of user ``u`` is **covered**, for each
  registered device ``d`` of ``u``, by the notification to ``(u, d)`` with the
  smallest ``event_id >= m``; a message without one is **missing**;
- every notification's ``event_id`` is itself an expected message of its user
  (the newest of its window is one): any other is **unexpected**;
- an ``Idempotency-Key`` the gateway took more than once is **duplicated**.

Reported: those counts (each must be 0); the push delay, from a message's
``created_at`` (MySQL) to the arrival at the gateway of the notification that
covers it, p50/p99 per phase (``CHAT_PUSH_DELAY_SECONDS`` included, and the
retries' backoff in the outage and recovery phases), and the same for the
newest message of each notification alone; the pusher's CPU (/proc of its pid,
over the phases and the drain) per notification taken and per message posted;
and the online users' delivery p50/p99 (POST -> frame on the socket) in each
phase: a gateway that fails must leave it unchanged. Online delivery is also
checked: 0 lost, 0 duplicated.

Writes var/bench/push.json, or with ``--publish`` loadtest/results/push-latest.json
and the generated section of docs/benchmarks.md ("Offline push").
"""

from __future__ import annotations

import asyncio
import bisect
import multiprocessing as mp
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import orjson
import typer

from chat import auth
from chatctl.client import Inbox
from harness.push_gateway import PushGateway
from loadtest import wsload
from loadtest.clients import lean as leanclient
from loadtest.clients import lean_processes
from loadtest.clients.lean_processes import LeanJob
from loadtest.clients.websocket import masked
from loadtest.common import machine
from loadtest.common.results import RESULTS, UNPUBLISHED
from loadtest.common.units import per_unit_us, ratio
from loadtest.report.push_table import push_table
from loadtest.report.write import write_result

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

    from sqlalchemy.engine import Engine

    from harness.system import System

NORMAL, OUTAGE, RECOVERY = "normal", "outage", "recovery"
PHASES = (NORMAL, OUTAGE, RECOVERY)
MESSAGE = 0  # chat.messages.Kind.MESSAGE: the only kind of row that is pushed
WS_DEVICE = "ws"  # the online users' device (?device= on /v1/ws): the one their acks count for
PUSH_DEVICE = "phone"  # the offline users' registered device
APP_ID = "chat.bench"
DELAY_SECONDS = 3.0  # CHAT_PUSH_DELAY_SECONDS, as deployed (its default)
TEXT = 0x1
REGISTER_CONCURRENCY = 32
IDLE_SECONDS = 5.0  # the pusher's CPU measured with nothing to push, before the phases
SETTLE_LIMIT_SECONDS = 120.0  # the wait for a phase's pushes, and the drain's floor
OUT_DEFAULT = UNPUBLISHED / "push.json"
OUT_PUBLISHED = RESULTS / "push-latest.json"


# --- the online clients (processes of their own) --------------------------------------------


@dataclass
class PushShared:
    connected: Synchronized[int]
    messages: Synchronized[int]  # message frames received, every process
    stop: Event


class Acker:
    """One client process's connections: each acks every message frame it receives, and
    records ``[sent_at, delivery s]`` of it (the send time is the body's first word)."""

    def __init__(self, job: LeanJob) -> None:
        self.job = job
        self.inboxes = {u: Inbox() for u in job.users}
        self.clients: dict[str, leanclient.LeanClient] = {}
        self.latencies: list[list[float]] = []
        self.acks = 0
        self.errors: list[dict] = []
        self.error_count = 0
        self.counted = 0

    def on_frame(self, user: str, doc: dict, now: float) -> None:
        kind = doc.get("type")
        if kind == "message":
            self.counted += 1
            sent_at = float(doc["body"].split(" ", 1)[0])
            self.latencies.append([sent_at, now - sent_at])
            client = self.clients.get(user)
            if client is not None and not client.transport.is_closing():
                client.transport.write(masked(TEXT, orjson.dumps({"type": "ack", "upto": doc["id"]})))
                self.acks += 1
        elif kind == "error":
            self.error_count += 1
            if len(self.errors) < 100:
                self.errors.append({k: doc.get(k) for k in ("code", "message", "frame")})


async def _clients(job: LeanJob, shared: PushShared) -> None:
    side = Acker(job)
    failures = 0
    gate = asyncio.Semaphore(200)  # handshakes in flight

    async def one(user: str) -> None:
        nonlocal failures
        client = await lean_processes.connect_retrying(
            gate, job.host, job.port, auth.mint(job.secret, user, 7200), side.inboxes[user],
            lambda doc, now: side.on_frame(user, doc, now), job.source, query=f"device={WS_DEVICE}")
        if client is None:
            failures += 1
            return
        side.clients[user] = client
        lean_processes.count(shared.connected)

    tasks = [asyncio.create_task(one(u)) for u in job.users]
    while not shared.stop.is_set():
        await asyncio.sleep(0.05)
        if side.counted:
            lean_processes.count(shared.messages, side.counted)
            side.counted = 0
    await lean_processes.close_and_write(
        job.out, side.inboxes, side.clients, tasks, failures,
        latencies=side.latencies, acks=side.acks, errors=side.errors, error_count=side.error_count)


# --- pure: the expected set, the match, the summaries (tests/core/test_push_bench.py) -------


@dataclass(frozen=True, slots=True)
class StreamRow:
    """A row of a partition's stream, as the check reads it from MySQL (``created_at``: epoch s)."""

    partition: int
    id: int
    sender: str
    recipient: str
    created_at: float
    kind: int = MESSAGE
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class Push:
    """A notification the gateway took: its key is ``{partition}:{event_id}:{user}:{device}``."""

    arrival: float
    key: str
    partition: int
    event_id: int
    user: str
    device: str


def parse_received(records: Iterable[dict]) -> list[Push]:
    """The gateway's records (``{"arrival", "key", "notification"}``, harness/push_gateway.py) as pushes,
    named by their key."""
    out = []
    for record in records:
        arrival, key = record["arrival"], record["key"]
        partition, event_id, rest = key.split(":", 2)
        user, device = rest.rsplit(":", 1)
        out.append(Push(float(arrival), key, int(partition), int(event_id), user, device))
    return out


def expected_pushes(rows: Iterable[StreamRow], partition_of: Callable[[str], int],
                    decided: dict[int, tuple[int, int]], acked: dict[str, int],
                    read: dict[tuple[str, str], int], registered: dict[str, list[str]]) -> dict[str, dict[int, float]]:
    """user -> {message id: created_at} that the pusher must push to each of the user's registered devices:
    rows of the user's own partition within the pusher's decided range ``decided[partition] = (after, upto)``,
    messages (not events, not deleted) to the user from someone else, above the highest position any device
    of theirs acknowledged and above their read marker for the sender (docs/push.md)."""
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        user = r.recipient
        after, upto = decided.get(r.partition, (0, -1))
        if (r.kind != MESSAGE or r.deleted or user == r.sender or not registered.get(user)
                or partition_of(user) != r.partition or not after < r.id <= upto
                or r.id <= acked.get(user, 0) or r.id <= read.get((user, r.sender), 0)):
            continue
        out.setdefault(user, {})[r.id] = r.created_at
    return out


@dataclass
class Matched:
    notifications: int  # distinct keys taken
    duplicates: int  # takes of a key beyond its first
    unexpected: list[str]  # keys whose event_id is no expected message of their user (or no registered device)
    missing: list[tuple[str, str, int]]  # (user, device, message id) no notification covers
    covered: int  # (message, device) pairs covered
    message_delays: list[tuple[float, float]]  # (created_at, s to the covering notification's first arrival)
    newest_delays: list[tuple[float, float]]  # (created_at, s) of each expected notification's own event_id
    per_notification: list[int]  # messages each notification covers, per notification that covers any


def match(expected: dict[str, dict[int, float]], registered: dict[str, list[str]], pushes: list[Push]) -> Matched:
    """The gateway's pushes against the expected set (the module's doc says how)."""
    takes = Counter(p.key for p in pushes)
    first: dict[tuple[str, str, int], float] = {}
    unexpected = []
    for p in pushes:
        at = (p.user, p.device, p.event_id)
        if at in first:
            first[at] = min(first[at], p.arrival)
            continue
        first[at] = p.arrival
        if p.device not in registered.get(p.user, []) or p.event_id not in expected.get(p.user, {}):
            unexpected.append(p.key)
    events: dict[tuple[str, str], list[int]] = {}
    for user, device, event_id in first:
        events.setdefault((user, device), []).append(event_id)
    for ids in events.values():
        ids.sort()
    missing: list[tuple[str, str, int]] = []
    delays: list[tuple[float, float]] = []
    covers: Counter[tuple[str, str, int]] = Counter()
    for user, messages in expected.items():
        for device in registered.get(user, []):
            ids = events.get((user, device), [])
            for msg_id, created in sorted(messages.items()):
                i = bisect.bisect_left(ids, msg_id)
                if i == len(ids):
                    missing.append((user, device, msg_id))
                    continue
                at = (user, device, ids[i])
                covers[at] += 1
                delays.append((created, first[at] - created))
    newest = [(expected[u][e], first[(u, d, e)] - expected[u][e]) for (u, d, e) in first
              if e in expected.get(u, {}) and d in registered.get(u, [])]
    return Matched(notifications=len(takes), duplicates=sum(n - 1 for n in takes.values()), unexpected=unexpected,
                   missing=missing, covered=sum(covers.values()), message_delays=delays, newest_delays=newest,
                   per_notification=list(covers.values()))


def in_windows(pairs: Iterable[tuple[float, float]], starts: list[float]) -> list[list[float]]:
    """Each value, put in the phase its time falls in: phase i spans [starts[i], starts[i+1]), the last one
    has no end; a time before the first start belongs to none."""
    out: list[list[float]] = [[] for _ in starts]
    for at, value in pairs:
        i = bisect.bisect_right(starts, at) - 1
        if i >= 0:
            out[i].append(value)
    return out




def summarize(phases: list[dict], outs: list[dict], matched: Matched, expected_online: dict[str, list[int]],
              counts: dict) -> dict:
    """The phases' records (main process), the clients' files and the match, as the result."""
    starts = [p["started"] for p in phases]
    online = in_windows(((sent_at, lat) for o in outs for sent_at, lat in o["latencies"]), starts)
    delays = in_windows(matched.message_delays, starts)
    newest = in_windows(matched.newest_delays, starts)
    for p, lat, d, n in zip(phases, online, delays, newest, strict=True):
        p["online_delivery_ms"] = wsload.percentiles(lat)
        p["push_delay_ms"] = wsload.percentiles(d)
        p["push_delay_newest_ms"] = wsload.percentiles(n)
    by_name = {p["name"]: p for p in phases}
    received: dict[str, list[int]] = {}
    for o in outs:
        received.update(o["received"])
    lost = sum(len(set(ids) - set(received.get(u, []))) for u, ids in expected_online.items())
    dups = sum(o["duplicates"] for o in outs) + sum(len(v) - len(set(v)) for v in received.values())
    per_note = matched.per_notification
    cpu, window, idle = counts["pusher_cpu_seconds"], counts["pusher_cpu_window"], counts["pusher_idle_cores"]
    sent = sum(p["sent"] for p in phases)
    normal, outage = by_name.get(NORMAL, {}), by_name.get(OUTAGE, {})
    result = {
        "what": "offline push under load: the pusher's notifications against MySQL's expected set, their delay, "
                "the pusher's CPU, and live delivery while the gateway fails",
        "phases": {p["name"]: {k: v for k, v in p.items() if k != "name"} for p in phases},
        "push": {
            "expected_messages": sum(len(v) for v in counts["expected"].values()),
            "expected_users": len(counts["expected"]),
            "notifications": matched.notifications, "covered": matched.covered,
            "missing": len(matched.missing), "missing_examples": [list(m) for m in matched.missing[:10]],
            "duplicates": matched.duplicates,
            "unexpected": len(matched.unexpected), "unexpected_examples": matched.unexpected[:10],
            "messages_per_notification": {"mean": round(sum(per_note) / len(per_note), 3) if per_note else None,
                                          "max": max(per_note, default=None)},
            "delay_ms": normal.get("push_delay_ms"),
            "delay_all_ms": wsload.percentiles([d for _, d in matched.message_delays]),
            "gateway_refused": counts["gateway_refused"], "gateway_stalled": counts["gateway_stalled"],
            "undecided_messages": counts["undecided_messages"], "outbox_left": counts["outbox_left"],
            "drain_seconds": counts["drain_seconds"],
        },
        "pusher_cpu": {"seconds": round(cpu, 3), "window_seconds": round(window, 1), "idle_cores": idle,
                       "us_per_notification": per_unit_us(cpu, matched.notifications),
                       "us_per_notification_net": per_unit_us(max(0.0, cpu - idle * window), matched.notifications),
                       "us_per_message": per_unit_us(cpu, sent),
                       "normal_us_per_notification": per_unit_us(normal.get("pusher_cpu_seconds", 0.0),
                                                                 normal.get("gateway_taken", 0)),
                       "window": "from the first phase's start to the end of the drain"},
        "outage_effect": {
            "online_p50": ratio(outage.get("online_delivery_ms", {}).get("p50"),
                                normal.get("online_delivery_ms", {}).get("p50")),
            "online_p99": ratio(outage.get("online_delivery_ms", {}).get("p99"),
                                normal.get("online_delivery_ms", {}).get("p99"))},
        "online": {"held": counts["held"], "clients": counts["online"], "lost": lost, "duplicates": dups,
                   "acks_sent": sum(o["acks"] for o in outs),
                   "error_frame_count": sum(o["error_count"] for o in outs),
                   "error_frames": [e for o in outs for e in o["errors"]][:20],
                   "connect_failures": sum(o["failures"] for o in outs), "closed": sum(o["closed"] for o in outs),
                   "close_codes": sorted({c for o in outs for c in o["close_codes"]})},
        "registered": counts["registered"], "offline": counts["offline"],
        "register_refused": counts["register_refused"],
        "sent": sent, "asked": sum(p["asked"] for p in phases), "send_errors": sum(p["send_errors"] for p in phases),
        "refused": [x for p in phases for x in p["refused"]][:10],
        "host_cpu": counts["host_cpu"],
    }
    result["failed"] = failure(result)
    return result


def failure(result: dict) -> str | None:
    """Why the run's figures do not describe the load they name, or None."""
    problems = []
    push, online = result["push"], result["online"]
    if push["missing"] or push["duplicates"] or push["unexpected"]:
        problems.append(f"push: {push['missing']} missing, {push['duplicates']} duplicated, "
                        f"{push['unexpected']} unexpected")
    if not push["expected_messages"]:
        problems.append("no message was to be pushed")
    if push["undecided_messages"] or push["outbox_left"]:
        problems.append(f"not drained: {push['undecided_messages']} messages undecided, "
                        f"{push['outbox_left']} notifications in the outbox")
    if online["lost"] or online["duplicates"]:
        problems.append(f"online: {online['lost']} lost, {online['duplicates']} duplicated")
    if online["held"] < online["clients"]:
        problems.append(f"{online['held']}/{online['clients']} online clients held")
    if online["closed"]:
        problems.append(f"{online['closed']} connections closed (codes {online['close_codes']})")
    if result["registered"] < result["offline"]:
        problems.append(f"{result['registered']}/{result['offline']} devices registered")
    if result["sent"] < result["asked"] or result["refused"]:
        problems.append(f"{result['sent']} of {result['asked']} messages stored")
    return "; ".join(problems) or None


# --- the run ---------------------------------------------------------------------------------


async def register_devices(api_url: str, secret: str, users: list[str]) -> tuple[int, list[str]]:
    """One device per user (``POST /v1/devices``); (registered, refusals)."""
    registered = 0
    refused: list[str] = []
    gate = asyncio.Semaphore(REGISTER_CONCURRENCY)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        async def one(user: str) -> None:
            nonlocal registered
            headers = {"Authorization": f"Bearer {auth.mint(secret, user, 7200)}"}
            body = {"device": PUSH_DEVICE, "platform": "android", "app_id": APP_ID, "pushkey": f"pk-{user}"}
            async with gate:
                for attempt in range(5):
                    try:
                        async with session.post(f"{api_url}/v1/devices", json=body, headers=headers) as r:
                            answer = await r.read()
                        if r.status in (200, 201):
                            registered += 1
                            return
                        if 400 <= r.status < 500 and r.status != 429:
                            refused.append(f"{r.status} {answer[:200].decode(errors='replace')}")
                            return
                    except (aiohttp.ClientError, TimeoutError):
                        pass
                    await asyncio.sleep(0.2 * (attempt + 1))
                refused.append("no answer after 5 tries")

        await asyncio.gather(*(one(u) for u in users))
    return registered, refused


def sql(engine: Engine, statement: str, **params: object) -> list:
    from sqlalchemy import text

    with engine.connect() as conn:
        return list(conn.execute(text(statement), params).all())


def push_positions(engine: Engine) -> dict[int, int]:
    return {int(k): int(upto) for k, upto in sql(engine, "SELECT id, upto FROM push_state")}


def push_backlog(engine: Engine, partitions: int) -> tuple[int, int]:
    """(messages past the pusher's position, notifications in its outbox), every partition."""
    from db.partition_map import tables_of

    positions = push_positions(engine)
    undecided = 0
    for k in range(partitions):
        table = tables_of(k).messages.name
        undecided += sql(engine, f"SELECT COUNT(*) FROM {table} WHERE id > :upto AND kind = :kind",
                         upto=positions.get(k, 0), kind=MESSAGE)[0][0]
    outbox = sql(engine, "SELECT COUNT(*) FROM push_outbox")[0][0]
    return int(undecided), int(outbox)


def wait_pushed(engine: Engine, partitions: int, limit: float) -> tuple[float, int, int]:
    """Until every message is decided and the outbox is empty, at most ``limit`` s; (seconds, backlog)."""
    started = time.monotonic()
    undecided, outbox = push_backlog(engine, partitions)
    while (undecided or outbox) and time.monotonic() - started < limit:
        time.sleep(0.5)
        undecided, outbox = push_backlog(engine, partitions)
    return time.monotonic() - started, undecided, outbox


def wait_delivered(shared: PushShared, want: int, limit: float) -> float:
    started = time.monotonic()
    while shared.messages.value < want and time.monotonic() - started < limit:
        time.sleep(0.1)
    return time.monotonic() - started


def read_check_inputs(engine: Engine, start: dict[int, int]) -> tuple[list[StreamRow], Callable[[str], int],
                                                                      dict[int, tuple[int, int]], dict[str, int],
                                                                      dict[tuple[str, str], int],
                                                                      dict[str, list[str]]]:
    """What the expected set is computed from, read from MySQL after the run."""
    from db.partition_map import load_slot_map, tables_of

    slot_map = load_slot_map(engine)
    end = push_positions(engine)
    decided = {k: (start.get(k, 0), end.get(k, 0)) for k in range(slot_map.partitions)}
    rows: list[StreamRow] = []
    for k, (after, upto) in decided.items():
        table = tables_of(k).messages.name
        for r in sql(engine, f"SELECT id, sender, recipient, created_at, kind, deleted FROM {table}"
                             " WHERE id > :after AND id <= :upto", after=after, upto=upto):
            created = r.created_at.replace(tzinfo=UTC).timestamp()
            rows.append(StreamRow(k, int(r.id), r.sender, r.recipient, created, int(r.kind), bool(r.deleted)))
    acked = {u: int(upto) for u, upto in sql(engine, "SELECT user, MAX(upto) FROM device_acks GROUP BY user")}
    read = {(reader, peer): int(upto)
            for reader, peer, upto in sql(engine, "SELECT reader, peer, upto FROM read_markers")}
    registered: dict[str, list[str]] = {}
    for user, device in sql(engine, "SELECT user, device FROM devices ORDER BY user, device"):
        registered.setdefault(user, []).append(device)
    return rows, slot_map.partition_of, decided, acked, read, registered


def run(system: System, gateway: PushGateway, users: int, rate: float, seconds: float, outage: str) -> dict:
    from db.partition_map import load_slot_map
    from db.sql import make_engine

    names = [f"pu{users}-{i}" for i in range(users)]
    online, offline = names[: users // 2], names[users // 2:]
    engine = make_engine(system.dbs.mariadb.url(), 30)
    partitions = load_slot_map(engine).partitions
    started = time.monotonic()
    while len(push_positions(engine)) < partitions and time.monotonic() - started < 60:
        time.sleep(0.2)  # the pusher holds every partition's lease: from now on every message is decided
    start = push_positions(engine)
    registered, register_refused = asyncio.run(register_devices(system.api_url, system.secret, offline))
    print(f"[push] {registered}/{len(offline)} devices registered; pusher positions {start}", flush=True)

    nprocs = max(1, -(-len(online) // wsload.CLIENTS_PER_PROC))
    tmp = Path(tempfile.mkdtemp(prefix="push-"))
    ctx = mp.get_context("spawn")
    shared = PushShared(ctx.Value("i", 0), ctx.Value("l", 0), ctx.Event())
    procs = lean_processes.ClientProcesses(
        _clients, lean_processes.jobs(online, nprocs, system.ws_url, system.secret, tmp), shared, shared.stop)
    procs.start()
    held, connect_seconds, _half = lean_processes.wait_connected(shared.connected, len(online))
    print(f"[push] {held}/{len(online)} online clients connected in {connect_seconds:.1f} s", flush=True)
    time.sleep(2.0)

    pusher_pid = system.procs["pusher"].pid
    idle = machine.ProcessCpu([pusher_pid])
    time.sleep(IDLE_SECONDS)  # what the pusher costs with nothing to push: its steps poll MySQL
    idle_cores = idle.cores()
    pusher = machine.ProcessCpu([pusher_pid])
    measured_from = time.monotonic()
    host_cpu = machine.CpuWindow()
    expected_online: dict[str, list[int]] = {u: [] for u in online}
    phases: list[dict] = []
    drain = (0.0, 0, 0)
    try:
        for name in PHASES:
            if name == OUTAGE:
                gateway.mode(outage)
            elif name == RECOVERY:
                gateway.mode("ok")
            before = gateway.state()
            phase_cpu = machine.ProcessCpu([pusher_pid])
            phase_start = time.time()
            messages_before = shared.messages.value
            sent_expected, creation, send_errors, refused = asyncio.run(
                wsload._send(system.api_url, system.secret, names, rate, seconds, False, seed=len(phases) + 1))
            phase_end = time.time()
            want = messages_before + sum(len(ids) for u, ids in sent_expected.items() if u in expected_online)
            for user, ids in sent_expected.items():
                if user in expected_online:
                    expected_online[user].extend(ids)
            waited = 0.0
            if name == NORMAL:  # its pushes all in before the outage, so that none of them meets it
                wait_delivered(shared, want, 30)
                waited = wait_pushed(engine, partitions, SETTLE_LIMIT_SECONDS)[0]
            after = gateway.state()
            phases.append({"name": name, "started": phase_start, "send_seconds": round(phase_end - phase_start, 1),
                           "asked": int(rate * seconds), "sent": len(creation), "send_errors": send_errors,
                           "refused": refused[:3], "creation_ms": wsload.percentiles(creation),
                           "gateway_mode": outage if name == OUTAGE else "ok",
                           "gateway_taken": len(after["received"]) - len(before["received"]),
                           "gateway_refused": after["refused"] - before["refused"],
                           "settle_seconds": round(waited, 1),
                           "pusher_cpu_seconds": round(phase_cpu.seconds(), 3)})
            print(f"[push] {name}: {len(creation)} messages in {phase_end - phase_start:.1f} s, gateway took "
                  f"{phases[-1]['gateway_taken']}, refused {phases[-1]['gateway_refused']}", flush=True)
        gateway.mode("ok")
        want = sum(len(ids) for ids in expected_online.values())
        wait_delivered(shared, want, 60)
        # the retries' backoff is at most 60 s (pusher.core), each wait at most twice the one before
        drain = wait_pushed(engine, partitions, max(SETTLE_LIMIT_SECONDS, 4 * seconds + 60))
        time.sleep(1.0)  # a last request whose answer the pusher was recording
        cpu_seconds, cpu_window = pusher.seconds(), time.monotonic() - measured_from
        busy = host_cpu.result()
    finally:
        procs.stop()
    state = gateway.state()
    rows, partition_of, decided, acked, read, devices = read_check_inputs(engine, start)
    engine.dispose()
    expected = expected_pushes(rows, partition_of, decided, acked, read, devices)
    matched = match(expected, devices, parse_received(state["received"]))
    outs = procs.results()
    print(f"[push] drained in {drain[0]:.1f} s; {len(state['received'])} notifications taken", flush=True)
    return summarize(phases, outs, matched, expected_online, {
        "expected": expected, "pusher_cpu_seconds": cpu_seconds, "pusher_cpu_window": cpu_window,
        "pusher_idle_cores": idle_cores, "gateway_refused": state["refused"],
        "gateway_stalled": state["stalled"], "undecided_messages": drain[1], "outbox_left": drain[2],
        "drain_seconds": round(drain[0], 1), "held": held, "online": len(online), "offline": len(offline),
        "registered": registered, "register_refused": register_refused[:5], "host_cpu": busy})


def main(users: int = typer.Option(10_000, help="users: half online on WebSockets, half offline with a device"),
         rate: float = typer.Option(500.0, help="messages/s posted through the API"),
         seconds: float = typer.Option(20.0, help="each phase's send window (normal, outage, recovery)"),
         delay: float = typer.Option(DELAY_SECONDS, help="CHAT_PUSH_DELAY_SECONDS"),
         outage: str = typer.Option("fail", help="what the gateway does in the outage phase: fail (500) or stall"),
         quick: bool = typer.Option(False, "--quick", help="1,000 users at 100 msg/s, 10 s phases"),
         publish: bool = typer.Option(False, "--publish",
                                      help="write loadtest/results/push-latest.json and the page's section"),
         out: Path | None = typer.Option(None, help=f"the result JSON (default {OUT_DEFAULT})")) -> None:
    """One run on a private system of its own, deployed as `make run` deploys it, plus the pusher."""
    from harness.system import databases, running_system
    from loadtest.bench import AS_DEPLOYED, DEPLOYED_DAEMONS

    if outage not in ("fail", "stall"):
        raise typer.BadParameter("--outage is fail or stall")
    if quick:
        users, rate, seconds = 1000, 100.0, 10.0
    params = {"users": users, "online": users // 2, "offline": users - users // 2, "rate": rate,
              "seconds_per_phase": seconds, "phases": list(PHASES), "messages_per_phase": int(rate * seconds),
              "push_delay_seconds": delay, "outage": outage}
    started = time.monotonic()
    gateway = PushGateway()
    try:
        with databases(Path(tempfile.mkdtemp(prefix="push-dbs-"))) as dbs:
            with running_system(dbs, daemons=DEPLOYED_DAEMONS, **AS_DEPLOYED, CHAT_RATE_LIMIT_PER_SECOND="0",
                                CHAT_LOG_LEVEL="WARNING", CHAT_WRITER_QUEUE_MAX="50000",
                                CHAT_PUSH_GATEWAY_URL=gateway.url, CHAT_PUSH_DELAY_SECONDS=f"{delay:g}") as system:
                system.start("pusher")
                measured = run(system, gateway, users, rate, seconds, outage)
    finally:
        gateway.close()
    result = {"machine": machine.describe(), "parameters": params,
              "deployed": {**AS_DEPLOYED, "daemons": DEPLOYED_DAEMONS, "pushers": 1},
              "wall_seconds": round(time.monotonic() - started), **measured}
    write_result(result, out or (OUT_PUBLISHED if publish else OUT_DEFAULT), push_table, publish, "push")


if __name__ == "__main__":
    typer.run(main)
