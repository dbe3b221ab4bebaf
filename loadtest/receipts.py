"""What delivery acks and read markers cost (docs/receipts.md), measured in one run.

`python -m loadtest.receipts [--quick] [--publish]`: a private MariaDB and
FerretDB and the system as `make run` deploys it (the writer, the relay, the
API processes, the daemons), N lean WebSocket clients (one user each) and
messages posted through the API between random pairs at R msg/s, in phases on
the same system and the same connections:

- ``baseline``: the clients only read;
- ``acks``: every client answers every message frame with
  ``{"type": "ack", "upto": id}`` on its socket;
- ``reads``: every client answers every message addressed to it with
  ``{"type": "read", "peer": from, "upto": id}``.

The phases alternate (baseline, acks, reads, baseline, ...) for ``--rounds``
rounds, so that the machine's drift weighs on each alike; the figures that
matter are the ratios to the baseline of the same run. Measured per phase:
delivery of messages (POST -> frame on the recipient's socket), delivery of
the events (the ack or read frame sent -> the ``delivered`` or ``read`` frame
on the peer's socket, matched by actor and ``upto``), the CPU of the daemon,
writer, relay and API processes per message (/proc), the rows written to
MySQL by kind, and what the load clients themselves cost. Before the
traffic: the daemons' memory per idle connection (PSS and RSS growth).

Before each ``acks`` phase every client acks what it already holds, outside
the measured window: a first ack passes every earlier message, and its
``delivered`` events for the phases before would be counted as this one's.

Writes var/bench/receipts.json, or with ``--publish``
loadtest/results/receipts-latest.json and the generated section of
docs/benchmarks.md. FerretDB 1.24's figures, not MongoDB's.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import typer
from sqlalchemy import text

from chat import auth
from chatctl.client import Inbox
from loadtest import wsload
from loadtest.clients import lean as leanclient
from loadtest.clients import lean_processes
from loadtest.clients.lean_processes import LeanJob
from loadtest.clients.websocket import masked
from loadtest.common import machine
from loadtest.common.results import RESULTS, UNPUBLISHED
from loadtest.common.units import per_unit_us, ratio
from loadtest.report.receipts_table import receipts_table
from loadtest.report.write import write_result

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

    from sqlalchemy.engine import Engine

    from harness.system import System

BASELINE, ACKS, READS = "baseline", "acks", "reads"
PHASES = (BASELINE, ACKS, READS)
# What a client does with each frame: the mode the main process sets for a phase.
QUIET, ACKING, READING, CATCH_UP = 0, 1, 2, 3
CATCH_UP_TICKS = 100  # the catch-up acks go out over this many ticks of 50 ms: a burst of one per
# connection at once is more than the writer answers within its reply timeout
MODES = {BASELINE: QUIET, ACKS: ACKING, READS: READING}
EVENT_OF = {"ack": "delivered", "read": "read"}  # what a client frame becomes on the peer's socket
TEXT = 0x1
MEMORY_LIMIT_KB = 3.0  # docs/receipts.md: an idle connection stays at or under it
OUT_DEFAULT = UNPUBLISHED / "receipts.json"
OUT_PUBLISHED = RESULTS / "receipts-latest.json"


@dataclass
class ReceiptsShared:
    """What the main process and the client processes share: counters and the phase."""
    connected: Synchronized[int]
    messages: Synchronized[int]  # message frames received, every process
    frames: Synchronized[int]  # every frame received (messages, events, errors)
    mode: Synchronized[int]
    phase: Synchronized[int]  # index of the phase under way (-1: none), to tag what is measured
    stop: Event


class ReceiptsClients:
    """One client process's connections and what they saw and sent. Each record is
    a list (JSON): sent ``[phase, kind, user, upto, at]``; seen ``[event type, from,
    to, upto, at]`` (events on the socket of ``to``, the peer of the actor)."""

    def __init__(self, job: LeanJob) -> None:
        self.job = job
        self.mode, self.phase = QUIET, -1
        self.latencies: dict[int, list[float]] = {}  # phase -> message delivery, s
        self.sent: list[list] = []
        self.seen: list[list] = []
        self.own_events = 0  # events on the actor's own socket (its other devices' copy): counted, not timed
        self.errors: list[dict] = []
        self.error_count = 0
        self.catching_up = False
        self.catch_up_events = 0  # events while the catch-up acks are answered: counted, not timed
        self.to_catch_up: list[tuple[str, int]] = []
        self.counted_messages = self.counted_frames = 0
        self.inboxes = {u: Inbox() for u in job.users}
        self.clients: dict[str, leanclient.LeanClient] = {}
        self.newest: dict[str, int] = {}  # user -> the newest message id its socket got

    def on_frame(self, user: str, doc: dict, now: float) -> None:
        self.counted_frames += 1
        kind = doc.get("type")
        if kind == "message":
            self.counted_messages += 1
            msg_id = doc["id"]
            self.newest[user] = max(self.newest.get(user, 0), int(msg_id))
            self.latencies.setdefault(self.phase, []).append(now - float(doc["body"].split(" ", 1)[0]))
            if self.mode == ACKING:
                self.send(user, "ack", {"type": "ack", "upto": msg_id}, msg_id)
            elif self.mode == READING and doc["to"] == user and doc["from"] != user:
                self.send(user, "read", {"type": "read", "peer": doc["from"], "upto": msg_id}, msg_id)
        elif kind in ("delivered", "read"):
            if self.catching_up:
                self.catch_up_events += 1
            elif doc["to"] == user and doc["from"] != user:
                self.seen.append([kind, doc["from"], doc["to"], doc["upto"], now])
            else:
                self.own_events += 1
        elif kind == "error":
            self.error_count += 1
            if len(self.errors) < 100:
                self.errors.append({k: doc.get(k) for k in ("code", "message", "frame")})

    def send(self, user: str, kind: str, frame: dict, upto: str) -> None:
        client = self.clients.get(user)
        if client is None or client.transport.is_closing():
            return
        at = time.time()
        client.transport.write(masked(TEXT, orjson.dumps(frame)))
        if self.phase >= 0:
            self.sent.append([self.phase, kind, user, upto, at])

    def start_catch_up(self) -> None:
        """Every client is to ack the newest message it holds (not timed: outside any phase)."""
        self.catching_up = True
        self.to_catch_up = list(self.newest.items())

    def catch_up(self, ticks: int = CATCH_UP_TICKS) -> None:
        """One tick's share of the catch-up acks."""
        share = max(1, -(-len(self.newest) // ticks))
        for user, newest in self.to_catch_up[:share]:
            client = self.clients.get(user)
            if client is not None and not client.transport.is_closing():
                client.transport.write(masked(TEXT, orjson.dumps({"type": "ack", "upto": str(newest)})))
        del self.to_catch_up[:share]


async def _clients(job: LeanJob, shared: ReceiptsShared) -> None:
    side = ReceiptsClients(job)
    failures = 0
    gate = asyncio.Semaphore(200)  # handshakes in flight: stay under somaxconn

    async def one(user: str) -> None:
        nonlocal failures
        client = await lean_processes.connect_retrying(
            gate, job.host, job.port, auth.mint(job.secret, user, 7200), side.inboxes[user],
            lambda doc, now: side.on_frame(user, doc, now), job.source)
        if client is None:
            failures += 1
            return
        side.clients[user] = client
        lean_processes.count(shared.connected)

    tasks = [asyncio.create_task(one(u)) for u in job.users]
    caught_up_for = -1
    while not shared.stop.is_set():
        await asyncio.sleep(0.05)
        mode, phase = shared.mode.value, shared.phase.value
        if mode == CATCH_UP:
            if caught_up_for != phase:  # once per request (the phase field numbers them)
                side.start_catch_up()
                caught_up_for = phase
            side.catch_up()
            mode = QUIET
        else:
            side.catching_up = False
        side.mode, side.phase = mode, phase
        if side.counted_frames:  # shared counters: one lock per tick, not per frame
            lean_processes.count(shared.frames, side.counted_frames)
            lean_processes.count(shared.messages, side.counted_messages)
            side.counted_frames = side.counted_messages = 0
    await lean_processes.close_and_write(
        job.out, side.inboxes, side.clients, tasks, failures,
        latencies={str(k): v for k, v in side.latencies.items()}, sent=side.sent, seen=side.seen,
        own_events=side.own_events, errors=side.errors, error_count=side.error_count,
        catch_up_events=side.catch_up_events)


# --- pure: what the records say (tests/core/test_receipts_bench.py) -----------------------


def event_latencies(sent: Iterable[list], seen: Iterable[list]) -> tuple[dict[int, dict[str, list[float]]], int]:
    """({phase: {event type: [client frame sent -> event on the peer's socket, s]}}, events
    matched to no client frame). A ``delivered`` or ``read`` event from user A "up to" U
    answers A's ack or read frame of U: its first one, should A have sent two."""
    first: dict[tuple[str, str, str], tuple[int, float]] = {}
    for phase, kind, user, upto, at in sent:
        key = (EVENT_OF[kind], user, str(upto))
        if key not in first or at < first[key][1]:
            first[key] = (phase, at)
    out: dict[int, dict[str, list[float]]] = {}
    unmatched = 0
    for kind, actor, _peer, upto, at in seen:
        found = first.get((kind, actor, str(upto)))
        if found is None:
            unmatched += 1
            continue
        out.setdefault(found[0], {}).setdefault(kind, []).append(at - found[1])
    return out, unmatched




def combine(rounds: list[dict]) -> dict:
    """One phase's rounds as one row: latencies pooled, CPU and rows summed, then per message."""
    messages = sum(r["sent"] for r in rounds)
    cpu = {name: sum(r["cpu_seconds"][name] for r in rounds) for name in rounds[0]["cpu_seconds"]}
    rows: dict[str, int] = {}
    for r in rounds:
        for kind, n in r["rows"].items():
            rows[kind] = rows.get(kind, 0) + n
    events: dict[str, list[float]] = {}
    for r in rounds:
        for kind, values in r["event_latencies"].items():
            events.setdefault(kind, []).extend(values)
    frames_sent = {k: sum(r["frames_sent"].get(k, 0) for r in rounds) for k in ("ack", "read")}
    return {
        "rounds": len(rounds), "messages": messages,
        "message_ms": wsload.percentiles([v for r in rounds for v in r["latencies"]]),
        "event_ms": {kind: wsload.percentiles(values) for kind, values in sorted(events.items())},
        "cpu_us_per_message": {name: per_unit_us(s, messages) for name, s in cpu.items()},
        "rows": rows, "rows_per_message": {k: round(n / messages, 3) for k, n in rows.items()} if messages else {},
        "frames_sent": frames_sent,
        "frames_received_per_message": round(sum(r["frames"] for r in rounds) / messages, 2) if messages else None,
        "steal_pct": [r["host_cpu"]["steal_pct"] for r in rounds],
        "busy_pct": [r["host_cpu"]["busy_pct"] for r in rounds],
    }


def ratios(phases: dict[str, dict]) -> dict[str, dict]:
    """Each phase's figures over the baseline's of the same run."""
    base = phases[BASELINE]
    out = {}
    for name, row in phases.items():
        if name == BASELINE:
            continue
        out[name] = {
            "message_p50": ratio(row["message_ms"]["p50"], base["message_ms"]["p50"]),
            "message_p99": ratio(row["message_ms"]["p99"], base["message_ms"]["p99"]),
            **{f"cpu_{proc}": ratio(v, base["cpu_us_per_message"].get(proc))
               for proc, v in row["cpu_us_per_message"].items() if proc != "clients"},
        }
    return out


# --- the run ---------------------------------------------------------------------------------


def row_counts(engine: Engine) -> dict[str, int]:
    """Rows of the stream in MySQL by kind (one partition: the ``messages`` table)."""
    from chat.messages import Kind

    with engine.connect() as conn:
        found = conn.execute(text("SELECT kind, COUNT(*) FROM messages GROUP BY kind")).all()
    return {Kind(kind).name.lower(): int(n) for kind, n in found}


def one_phase(system: System, shared: ReceiptsShared, engine: Engine, index: int, name: str, rate: float,
              seconds: float, client_pids: list[int], expected: dict[str, list[int]]) -> dict:
    if name == ACKS:  # acks of the phases before, outside the window (see the module's doc)
        shared.phase.value, shared.mode.value = index, CATCH_UP
        lean_processes.wait_quiet(shared.frames, shared.messages, shared.messages.value, 3.0, 90)
    shared.phase.value, shared.mode.value = index, MODES[name]
    time.sleep(0.3)  # every client process has read it (they look every 50 ms)
    procs = {"daemons": [p.pid for n, p in system.procs.items() if n.startswith("daemon")],
             "writer": [system.procs["writer"].pid], "relay": [system.procs["relay"].pid],
             "apis": [p.pid for n, p in system.procs.items() if n.startswith("api")],
             "clients": client_pids, "sender": [os.getpid()]}
    cpu = {k: machine.ProcessCpu(pids) for k, pids in procs.items()}
    rows_before = row_counts(engine)
    host = machine.CpuWindow()
    messages_before = shared.messages.value
    sent_expected, creation, send_errors, refused = asyncio.run(
        wsload._send(system.api_url, system.secret, list(expected), rate, seconds, False))
    want = messages_before + sum(len(v) for v in sent_expected.values())
    settled = lean_processes.wait_quiet(shared.frames, shared.messages, want, 2.0, 30)
    cpu_seconds = {k: round(w.seconds(), 3) for k, w in cpu.items()}
    host_cpu = host.result()
    rows_after = row_counts(engine)
    shared.mode.value = QUIET
    for user, ids in sent_expected.items():
        expected[user].extend(ids)
    sent = len(creation)
    print(f"[receipts] {name} (phase {index}): {sent} messages in {seconds:g} s, settled in {settled:.1f} s, "
          f"daemons {per_unit_us(cpu_seconds['daemons'], sent)} µs/msg", flush=True)
    return {"name": name, "index": index, "sent": sent, "asked": int(rate * seconds), "send_errors": send_errors,
            "refused": refused[:3], "creation_ms": wsload.percentiles(creation), "settle_seconds": round(settled, 1),
            "cpu_seconds": cpu_seconds, "host_cpu": host_cpu,
            "rows": {k: rows_after.get(k, 0) - rows_before.get(k, 0) for k in rows_after
                     if rows_after.get(k, 0) != rows_before.get(k, 0)}}


def run(system: System, clients: int, rate: float, seconds: float, rounds: int) -> dict:
    from db.sql import make_engine

    daemon_pids = [p.pid for n, p in system.procs.items() if n.startswith("daemon")]
    users = [f"rc{clients}-{i}" for i in range(clients)]
    nprocs = max(1, -(-clients // wsload.CLIENTS_PER_PROC))
    tmp = Path(tempfile.mkdtemp(prefix="receipts-"))
    ctx = mp.get_context("spawn")
    shared = ReceiptsShared(ctx.Value("i", 0), ctx.Value("l", 0), ctx.Value("l", 0), ctx.Value("i", QUIET),
                            ctx.Value("i", -1), ctx.Event())
    procs = lean_processes.ClientProcesses(
        _clients, lean_processes.jobs(users, nprocs, system.ws_url, system.secret, tmp), shared, shared.stop)
    held = lean_processes.hold_connections(procs, shared.connected, clients, daemon_pids)
    print(f"[receipts] {held.line()}", flush=True)
    engine = make_engine(system.dbs.mariadb.url(), 30)
    expected: dict[str, list[int]] = {u: [] for u in users}
    done: list[dict] = []
    try:
        for _round in range(rounds):
            for name in PHASES:
                done.append(one_phase(system, shared, engine, len(done), name, rate, seconds, procs.pids(), expected))
        pss_after, rss_after = lean_processes.daemon_memory(daemon_pids)
    finally:
        procs.stop()
        engine.dispose()
    return summarize(done, procs.results(), expected, {
        **held.figures(),
        "pss_kb_per_conn_after_phases": lean_processes.kb_per_connection(held.idle[0], pss_after, held.held),
        "rss_kb_per_conn_after_phases": lean_processes.kb_per_connection(held.idle[1], rss_after, held.held)})


def summarize(done: list[dict], outs: list[dict], expected: dict[str, list[int]], held: dict) -> dict:
    """The phases' records (main process) and the clients' files as the result."""
    sent = [s for o in outs for s in o["sent"]]
    seen = [s for o in outs for s in o["seen"]]
    events, unmatched = event_latencies(sent, seen)
    latencies: dict[int, list[float]] = {}
    for o in outs:
        for k, v in o["latencies"].items():
            latencies.setdefault(int(k), []).extend(v)
    frames_sent: dict[int, dict[str, int]] = {}
    for phase, kind, *_ in sent:
        frames_sent.setdefault(phase, {}).setdefault(kind, 0)
        frames_sent[phase][kind] += 1
    for d in done:
        d["latencies"] = latencies.get(d["index"], [])
        d["event_latencies"] = events.get(d["index"], {})
        d["frames_sent"] = frames_sent.get(d["index"], {})
        d["frames"] = len(d["latencies"]) + sum(len(v) for v in d["event_latencies"].values())
    phases = {name: combine([d for d in done if d["name"] == name]) for name in PHASES}
    received: dict[str, list[int]] = {}
    for o in outs:
        received.update(o["received"])
    lost = sum(len(set(ids) - set(received.get(u, []))) for u, ids in expected.items())
    dups = sum(o["duplicates"] for o in outs) + sum(len(v) - len(set(v)) for v in received.values())
    cpu_clients = sum(d["cpu_seconds"]["clients"] for d in done)
    frames = sum(d["frames"] for d in done) + sum(sum(d["frames_sent"].values()) for d in done)
    result = {
        "what": "the cost of delivery acks and read markers: phases of one run on one system, same connections",
        "memory": {**held, "limit_kb": MEMORY_LIMIT_KB,
                   "within_limit": held["pss_kb_per_conn"] <= MEMORY_LIMIT_KB
                   and held["rss_kb_per_conn"] <= MEMORY_LIMIT_KB},
        "phases": phases, "ratios": ratios(phases),
        "client_cost": {
            "what": "loadtest.clients.lean: asyncio and uvloop, in processes of their own, on the same cores",
            "cpu_us_per_frame": per_unit_us(cpu_clients, frames),
            "sender_cpu_us_per_message": per_unit_us(sum(d["cpu_seconds"]["sender"] for d in done),
                                                        sum(d["sent"] for d in done))},
        "sent": sum(d["sent"] for d in done), "asked": sum(d["asked"] for d in done),
        "send_errors": sum(d["send_errors"] for d in done), "refused": [x for d in done for x in d["refused"]],
        "lost": lost, "duplicates": dups, "unmatched_events": unmatched,
        "catch_up_events": sum(o["catch_up_events"] for o in outs),
        "own_socket_events": sum(o["own_events"] for o in outs),
        "error_frames": [e for o in outs for e in o["errors"]][:20],
        "error_frame_count": sum(o["error_count"] for o in outs),
        "connect_failures": sum(o["failures"] for o in outs), "closed": sum(o["closed"] for o in outs),
        "close_codes": sorted({c for o in outs for c in o["close_codes"]}),
        "runs": [{k: v for k, v in d.items() if k not in ("latencies", "event_latencies")} for d in done],
    }
    result["failed"] = failure(result)
    return result


def failure(result: dict) -> str | None:
    """Why the run's figures do not describe the load they name, or None."""
    problems = []
    if result["lost"] or result["duplicates"]:
        problems.append(f"{result['lost']} lost, {result['duplicates']} duplicated")
    if result["memory"]["held"] < result["memory"]["clients"]:
        problems.append(f"{result['memory']['held']}/{result['memory']['clients']} held")
    if result["sent"] < result["asked"] or result["refused"]:
        problems.append(f"{result['sent']} of {result['asked']} messages stored")
    if result["error_frame_count"]:
        problems.append(f"{result['error_frame_count']} error frames")
    if result["closed"]:
        problems.append(f"{result['closed']} connections closed (codes {result['close_codes']})")
    return "; ".join(problems) or None


def main(clients: int = typer.Option(10_000, help="WebSocket clients, one user each"),
         rate: float = typer.Option(1000.0, help="messages/s posted through the API"),
         seconds: float = typer.Option(15.0, help="each phase's send window"),
         rounds: int = typer.Option(2, min=1, max=10, help="baseline, acks, reads, alternated this many times"),
         quick: bool = typer.Option(False, "--quick", help="1,000 clients at 200 msg/s, 10 s phases, one round"),
         publish: bool = typer.Option(False, "--publish",
                                      help="write loadtest/results/receipts-latest.json and the page's tables"),
         out: Path | None = typer.Option(None, help=f"the result JSON (default {OUT_DEFAULT})")) -> None:
    """One run on a private system of its own, deployed as `make run` deploys it."""
    from harness.system import databases, running_system
    from loadtest.bench import AS_DEPLOYED, DEPLOYED_DAEMONS

    if quick:
        clients, rate, seconds, rounds = 1000, 200.0, 10.0, 1
    params = {"clients": clients, "rate": rate, "seconds_per_phase": seconds, "rounds": rounds,
              "messages_per_phase": int(rate * seconds)}
    started = time.monotonic()
    with databases(Path(tempfile.mkdtemp(prefix="receipts-dbs-"))) as dbs:
        with running_system(dbs, daemons=DEPLOYED_DAEMONS, **AS_DEPLOYED, CHAT_RATE_LIMIT_PER_SECOND="0",
                            CHAT_LOG_LEVEL="WARNING", CHAT_WRITER_QUEUE_MAX="50000") as system:
            measured = run(system, clients, rate, seconds, rounds)
    result = {"machine": machine.describe(), "parameters": params,
              "deployed": {**AS_DEPLOYED, "daemons": DEPLOYED_DAEMONS},
              "wall_seconds": round(time.monotonic() - started), **measured}
    write_result(result, out or (OUT_PUBLISHED if publish else OUT_DEFAULT), receipts_table, publish, "receipts")


if __name__ == "__main__":
    typer.run(main)
