"""Our daemon tier and Centrifugo v5.4.9 in one run, on the same cores, driven by the same clients.

    .venv/bin/python -m loadtest.peers --clients 10000 --rounds 2

Each side in turn (ours, Centrifugo; the next round the other way round):
1. the server alone, then the same load clients (``--client go``, the default: the compiled
   ``loadtest/clients/go``; ``--client python``: ``loadtest.clients.peers``) connect
   ``--clients`` users to it: server memory per idle connection (PSS);
2. a separate feed process follows the same schedule of rates, message for
   message: ours is the host's relay on its Unix socket, each batch committed
   to MySQL first (``loadtest.peers.feeder``); Centrifugo's is its server HTTP API,
   one batch request per tick (``loadtest.peers.centrifugo_feed``);
3. per step: delivered, lost, duplicated, latency p50/p99 from the feed's
   clock to the client, and CPU per message of the server, of its feed and of the
   load clients. The clients share the server's cores: a side whose clients cost more
   than half the server's CPU per frame at its sustained rate or its knee is marked
   ``client_bound``.
The sustained rate is the highest step with p99 < 100 ms and nothing lost,
every step below it passing too. Steps past it are the overload: ours must
lose nothing there either (what a daemon sheds is read back from MySQL).
Ours as two daemon processes on one SO_REUSEPORT port, the relay routing by user
(``--ours-daemons`` for another count), against one Centrifugo process, which uses both cores.

Writes loadtest/results/peers-latest.json. Exits non-zero if ours lost or
duplicated a message in any step.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import bson
import orjson
import psutil
import typer
from sqlalchemy import text

from db.sql import make_engine
from loadtest.clients import centrifugo, loadclient
from loadtest.common import machine
from loadtest.peers import figures as peer_figures
from loadtest.peers import report as peer_report
from loadtest.clients import peers as peerclients
from loadtest.peers.feeder import parse_steps, recipients, step_ranges
from loadtest.million.scenario import pss
from loadtest.common.results import RESULTS
from harness.servers import ROOT

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess

    from harness.system import Databases

# Two daemon processes, as supervisord.conf runs them on this 2-core box, the relay routing by
# user so that each decodes its share (docs/decisions/relay-by-user.md). Without the routing
# each would decode every message (loadtest/results/peers-two-daemons.json: two sustained
# less than one).
OUR_DAEMONS = 2
CLIENTS_PER_PROC = 5_000  # enough processes to spread the parsing over both cores
DEFAULT_STEPS = "5000x4,10000x4,15000x4,20000x4,25000x4,30000x4,35000x4,40000x4"
# Messages/s with 50 devices per user (50 frames each), the last steps past the knee and longer.
OVERLOAD_STEPS = "200x4,400x4,600x4,800x4,1200x8,1800x8,2400x8,3000x8"
# Who holds the connections: "go", the compiled client (loadtest/clients/go), whose CPU per frame
# is a third to a half of either server's here; "python", loadtest.clients.peers, which costs
# about what the server does on the same cores (and so measured both servers near the same rate).
CLIENTS = ("go", "python")
DEFAULT_CLIENT = "go"
WHO = {"go": "the compiled Go client", "python": "Python"}
Tally = tuple[dict, array, array]  # a client process's counts, and its first arrivals' ids and latencies


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class CpuSampler(threading.Thread):
    """Cumulative CPU seconds of named groups of processes, sampled every 0.2 s with the wall-clock time."""

    def __init__(self, groups: dict[str, list[int]]):
        super().__init__(daemon=True)
        self.procs = {k: [psutil.Process(p) for p in pids] for k, pids in groups.items()}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            self.samples.append((time.time(), {k: machine.cpu_seconds(v) for k, v in self.procs.items()}))


class PythonClients:
    """``loadtest.clients.peers`` in processes of their own, ``CLIENTS_PER_PROC`` users each."""

    def __init__(self, kind: str, users: list[str], host: str, port: int, secret: str, tmp: Path):
        ctx = mp.get_context("spawn")
        self._connected, self._frames, self._stop = ctx.Value("i", 0), ctx.Value("l", 0), ctx.Event()
        nprocs = max(1, -(-len(users) // CLIENTS_PER_PROC))
        self.jobs = [peerclients.PeersJob(kind, users[k::nprocs], host, port, secret, f"127.0.0.{2 + k}",
                                     str(tmp / f"{kind}-c{k}.json")) for k in range(nprocs)]
        self.procs: list[SpawnProcess] = [
            ctx.Process(target=peerclients.client_proc, args=(j, self._connected, self._frames, self._stop),
                        daemon=True) for j in self.jobs]
        for p in self.procs:
            p.start()

    def connected(self) -> int:
        return int(self._connected.value)

    def frames(self) -> int:
        return int(self._frames.value)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def stop(self) -> list[Tally]:
        self._stop.set()
        for p in self.procs:
            p.join(60)
        return [peerclients.read_tally(j.out) for j in self.jobs]


class GoClients:
    """The compiled client (``loadtest.clients.loadclient``): one process holds every connection,
    from as many source addresses as the Python clients use; it is told what each device is owed."""

    def __init__(self, kind: str, users: list[str], host: str, port: int, secret: str, tmp: Path,
                 owed: dict[str, int]):
        sources = [f"127.0.0.{2 + k}" for k in range(max(1, -(-len(users) // CLIENTS_PER_PROC)))]
        self.base = tmp / f"{kind}-go.json"
        opts = loadclient.Options(kind, f"ws://{host}:{port}", loadclient.write_users(tmp / f"{kind}-users.txt", users),
                                  secret, sources, expect=loadclient.write_expect(tmp / f"{kind}-owed.txt", owed),
                                  ids_out=self.base)
        self.running = loadclient.Running(opts)

    def connected(self) -> int:
        return self.running.connected()

    def frames(self) -> int:
        return self.running.frames()

    def pids(self) -> list[int]:
        return [self.running.pid]

    def own_cpu_per_frame(self, start: float, end: float) -> float | None:
        return loadclient.own_cpu_per_frame(self.running.history, start, end)

    def stop(self) -> list[Tally]:
        result = self.running.stop()
        self.base.with_suffix(".progress.json").write_bytes(orjson.dumps(self.running.history))
        ids, lat = loadclient.read_arrivals(self.base)
        return [(loadclient.peer_tally(result), ids, lat)]


def _clients(client: str, kind: str, users: list[str], host: str, port: int, secret: str, tmp: Path,
             owed: dict[str, int]) -> PythonClients | GoClients:
    if client == "go":
        return GoClients(kind, users, host, port, secret, tmp, owed)
    return PythonClients(kind, users, host, port, secret, tmp)


def _wait_connected(connected: Callable[[], int], want: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while connected() < want and time.monotonic() < deadline:
        time.sleep(0.2)
    return connected()


def _measure(kind: str, server: list[int], feed_pids: list[int], feed_cmd: list[str], feed_env: dict | None,
             host: str, port: int, secret: str, clients: int, devices: int, steps: list[tuple[float, float]],
             gap: float, tmp: Path, client: str = "python") -> dict:
    """Memory, then the schedule: one side, its server already listening. ``clients``
    connections, ``devices`` of them per user (each message goes to every device of its user),
    held by ``client`` (CLIENTS)."""
    ranges = step_ranges(steps)
    tmp = Path(tempfile.mkdtemp(dir=tmp, prefix=f"{kind}-"))  # this run's files only
    users = [f"p{i}" for i in range(clients // devices) for _ in range(devices)]
    time.sleep(1.0)
    idle = pss(server)
    owed = loadclient.owed(users, recipients(clients // devices, ranges[-1][1]))
    held_by = _clients(client, kind, users, host, port, secret, tmp, owed)
    held = _wait_connected(held_by.connected, clients, 60 + clients / 300)
    time.sleep(3.0)
    loaded = pss(server)
    log(f"{kind}: {held} connected, {(loaded - idle) / max(held, 1) / 1024:.2f} KB each")
    feed_out = tmp / f"{kind}-feed.json"
    feeder = subprocess.Popen([*feed_cmd, "--out", str(feed_out)], env=feed_env, stdout=sys.stderr, stderr=sys.stderr)
    deadline = time.monotonic() + 60
    while not feed_out.with_suffix(".ready").exists():
        if feeder.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {kind} feed did not start")
        time.sleep(0.1)
    time.sleep(0.5)
    sampler = CpuSampler({"server": server, "feed": [feeder.pid, *feed_pids], "clients": held_by.pids()})
    sampler.start()
    feeder.send_signal(signal.SIGUSR1)
    budget = time.monotonic() + sum(s for _, s in steps) + gap * len(steps) + 120
    while not feed_out.exists() and time.monotonic() < budget and feeder.poll() is None:
        time.sleep(0.2)
    # Past the knee a backlog drains after the schedule: wait for every frame, or until none
    # has come for 10 s (what is still missing then is lost), 180 s at most.
    want, last, still, hard = devices * ranges[-1][1], -1, time.monotonic(), time.monotonic() + 180
    while (got := held_by.frames()) < want and time.monotonic() - still < 10 and time.monotonic() < hard:
        if got != last:
            last, still = got, time.monotonic()
        time.sleep(0.2)
    drained = time.time()
    sampler.stopping.set()
    sampler.join()
    tallies = held_by.stop()
    feeder.send_signal(signal.SIGTERM)
    feeder.wait(30)
    feed = orjson.loads(feed_out.read_bytes()) if feed_out.exists() else {"steps": []}
    figures = peer_figures.per_step(ranges, [(ids, lat) for _, ids, lat in tallies], copies=devices)
    dups = sum(t["duplicates"] for t, _, _ in tallies)
    for fig, mark, (rate, _) in zip(figures, feed["steps"] + [{}] * len(figures), steps, strict=False):
        fig["rate"] = rate
        if mark:
            cpu = peer_figures.cpu_in(sampler.samples, mark["start"], mark["end"] + gap)
            fig["feed_behind_ms"] = mark["behind_ms"]
            fig["offered_per_s"] = mark["offered_per_s"]
            fig["cpu_us_per_msg"] = {k: round(v / fig["messages"] * 1e6, 2) for k, v in cpu.items()}
            fig["cpu_us_per_frame"] = {k: round(v / fig["frames"] * 1e6, 2) for k, v in cpu.items()}
            fig["client_bound"] = peer_figures.client_bound(fig["cpu_us_per_frame"])
            if isinstance(held_by, GoClients):
                # the client's own count, as a check on the sampled one
                fig["client_own_cpu_us_per_frame"] = held_by.own_cpu_per_frame(mark["start"], mark["end"] + gap)
    best, knee = peer_figures.sustained(figures)
    drain = round(drained - feed["steps"][-1]["end"], 1) if feed["steps"] else None
    at_best = next((f for f in figures if f["rate"] == best), None)
    return {
        "side": kind, "clients": clients, "devices_per_user": devices, "held": held,
        "kb_per_conn": round((loaded - idle) / max(held, 1) / 1024, 2),
        "idle_server_mb": round(idle / 2**20, 1), "max_rate_p99_100ms": best, "knee_rate": knee,
        "cpu_us_per_msg": (at_best or {}).get("cpu_us_per_msg"), "steps": figures,
        "lost": sum(f["lost"] for f in figures), "duplicated": dups, "drained_s_after_schedule": drain,
        "reconnects": sum(t["reconnects"] for t, _, _ in tallies),
        "close_codes": _merge(t["close_codes"] for t, _, _ in tallies),
        "connect_failures": sum(t["connect_failures"] for t, _, _ in tallies),
        **peer_figures.client_cost(client, figures, best, knee), **_client_own(tallies),
        **{k: v for k, v in feed.items() if k != "steps"},
    }


def _client_own(tallies: list[Tally]) -> dict:
    """What the compiled client counted itself over the whole run (the Python clients count no loss)."""
    own = [t for t, _, _ in tallies if t.get("lost") is not None]
    if not own:
        return {}
    return {"client_lost": sum(t["lost"] for t in own),
            "client_devices_with_loss": sum(t["devices_with_loss"] for t in own),
            "client_cpu_us_per_frame_whole_run": own[0]["client_cpu_us_per_frame"] if len(own) == 1 else None,
            "client_frames_per_read": own[0]["client_frames_per_read"] if len(own) == 1 else None,
            "client_frames_per_wake": own[0]["client_frames_per_wake"] if len(own) == 1 else None}


def _merge(dicts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out



def recorded_entries(dbs: Databases, tmp: Path) -> Path:
    """The writer's oplog entries for 200 messages, recorded once: the feed replays them at each step's rate."""
    from loadtest import replay

    entries_file = tmp / "entries.bson"
    entries_file.write_bytes(b"".join(bson.encode(e) for e in replay.record(dbs.ferretdb.url, 200)))
    return entries_file

def run_ours(dbs: Databases, entries_file: Path, clients: int, devices: int, steps_text: str, gap: float, tmp: Path,
             truth: bool, daemons: int = 1, client: str = DEFAULT_CLIENT, daemon_root: Path | None = None) -> dict:
    """``truth``: each batch is committed to MySQL before the relay has it, and what the daemon
    misses is read back from there; without it, a batch the relay never hands over is lost.
    ``daemons``: processes on the one SO_REUSEPORT port, each with its metrics port;
    ``daemon_root``: the checkout whose daemon runs (an A/B of two revisions), else this one."""
    from harness.servers import env_for, free_port, stop
    from harness.system import wait_listening

    engine = make_engine(dbs.mariadb.url(), 10)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE TABLE messages"))  # a daemon starts from MySQL's newest id
    engine.dispose()
    sock, port = tmp / "relay.sock", free_port()
    env = env_for(dbs.mariadb, dbs.ferretdb, CHAT_DAEMON_PORT=str(port), CHAT_OPLOG_RELAY_SOCKET=str(sock),
                  CHAT_LOG_LEVEL="WARNING", CHAT_MAX_CONNECTIONS="18000", CHAT_PING_INTERVAL_SECONDS="120",
                  CHAT_METRICS_PORT=str(free_port()), CHAT_FILL_HOLES_FROM_MYSQL=str(truth).lower(),
                  # more than one daemon: each asks the relay for its own users' entries only
                  CHAT_RELAY_ROUTE_BY_USER=str(daemons > 1).lower())
    feed_cmd = [sys.executable, "-m", "loadtest.peers.feeder", "--socket", str(sock), "--entries", str(entries_file),
                "--mysql-url", dbs.mariadb.url() if truth else "", "--clients", str(clients // devices),
                "--steps", steps_text, "--gap", str(gap), "--subscribers", str(daemons)]
    procs = [subprocess.Popen([sys.executable, "-m", "daemon"], env={**env, "CHAT_METRICS_PORT": str(free_port())},
                              cwd=daemon_root or ROOT, stdout=sys.stderr, stderr=sys.stderr) for _ in range(daemons)]
    try:
        for proc in procs:
            wait_listening(proc, port, 30)
        truth_pids = [machine.pid_of(dbs.mariadb.proc)] if truth else []
        result = _measure("ours", [p.pid for p in procs], truth_pids, feed_cmd, env, "127.0.0.1", port,
                          env["CHAT_JWT_SECRET"], clients, devices, parse_steps(steps_text), gap, tmp, client)
        return {**result, "truth": "MySQL" if truth else None, "daemons": daemons, "routed_by_user": daemons > 1}
    finally:
        for proc in procs:
            stop(proc, signal.SIGTERM)


def run_centrifugo(clients: int, devices: int, steps_text: str, gap: float, tmp: Path,
                   client: str = DEFAULT_CLIENT) -> dict:
    from harness.servers import free_port, stop

    port, secret, api_key = free_port(), "peer-secret-" + "0" * 32, "peer-api-key"
    server = centrifugo.start(tmp / "centrifugo", port, secret, api_key)
    feed_cmd = [sys.executable, "-m", "loadtest.peers.centrifugo_feed", "--api", f"http://127.0.0.1:{port}",
                "--api-key", api_key, "--clients", str(clients // devices), "--steps", steps_text, "--gap", str(gap)]
    try:
        return _measure("centrifugo", [server.pid], [], feed_cmd, None, "127.0.0.1", port, secret, clients,
                        devices, parse_steps(steps_text), gap, tmp, client)
    finally:
        stop(server, signal.SIGTERM)


def summarize(rounds: list[dict[str, dict]]) -> dict:
    def med(side: str, key: str) -> float | None:
        values = [r[side][key] for r in rounds if r[side].get(key) is not None]
        return round(statistics.median(values), 2) if values else None

    def med_cpu(side: str, part: str) -> float | None:
        values = [r[side]["cpu_us_per_msg"][part] for r in rounds if (r[side].get("cpu_us_per_msg") or {}).get(part)]
        return round(statistics.median(values), 2) if values else None

    out = {
        "peer": "centrifugo 5.4.9",
        "ours_kb_per_conn": med("ours", "kb_per_conn"), "peer_kb_per_conn": med("centrifugo", "kb_per_conn"),
        "ours_max_rate_p99_100ms": med("ours", "max_rate_p99_100ms"),
        "peer_max_rate_p99_100ms": med("centrifugo", "max_rate_p99_100ms"),
        "ours_cpu_us_per_msg": med_cpu("ours", "server"), "peer_cpu_us_per_msg": med_cpu("centrifugo", "server"),
        "ours_feed_cpu_us_per_msg": med_cpu("ours", "feed"), "peer_feed_cpu_us_per_msg": med_cpu("centrifugo", "feed"),
        "ours_lost": sum(r["ours"]["lost"] for r in rounds),
        "ours_duplicated": sum(r["ours"]["duplicated"] for r in rounds),
        "peer_lost": sum(r["centrifugo"]["lost"] for r in rounds),
        "peer_duplicated": sum(r["centrifugo"]["duplicated"] for r in rounds),
    }
    # The load client beside each server: its CPU per frame and the server's at the sustained
    # rate, and whether any round was bound by the client (then its rate says little of the server).
    out["client"] = rounds[0]["ours"].get("client") if rounds else None
    for prefix, side in (("ours", "ours"), ("peer", "centrifugo")):
        out[f"{prefix}_server_cpu_us_per_frame"] = med(side, "server_cpu_us_per_frame")
        out[f"{prefix}_client_cpu_us_per_frame"] = med(side, "client_cpu_us_per_frame")
        marks = [r[side].get("client_bound") for r in rounds]
        out[f"{prefix}_client_bound"] = True if any(marks) else (False if marks and None not in marks else None)
    out["memory_ratio"] = peer_figures.ratio(out["ours_kb_per_conn"], out["peer_kb_per_conn"])
    out["rate_ratio"] = peer_figures.ratio(out["ours_max_rate_p99_100ms"], out["peer_max_rate_p99_100ms"])
    out["cpu_ratio"] = peer_figures.ratio(out["ours_cpu_us_per_msg"], out["peer_cpu_us_per_msg"])
    return out


def _line(side: str, s: dict) -> None:
    log(f"{side}: {s['kb_per_conn']} KB/conn, sustained {s['max_rate_p99_100ms']} msg/s "
        f"(knee {s['knee_rate']}), lost {s['lost']}, duplicated {s['duplicated']}; CPU per frame: server "
        f"{s.get('server_cpu_us_per_frame')} µs, {s.get('client')} clients {s.get('client_cpu_us_per_frame')} µs"
        + (" (CLIENT-BOUND)" if s.get("client_bound") else ""))


def run(clients: int, rounds: int, steps_text: str, gap: float, overload_steps: str, overload_devices: int,
        ours_daemons: int = OUR_DAEMONS, client: str = DEFAULT_CLIENT) -> dict:
    from harness.system import databases

    if client not in CLIENTS:
        raise ValueError(f"client is one of {CLIENTS}, got {client!r}")
    subprocess.run([str(ROOT / "scripts" / "install-centrifugo.sh")], check=True)
    if client == "go":
        loadclient.install()
    tmp = Path(tempfile.mkdtemp(prefix="peers-"))
    results: list[dict[str, dict]] = []
    overload: dict[str, dict] = {}
    with databases(tmp / "dbs") as dbs:
        entries_file = recorded_entries(dbs, tmp)
        for r in range(rounds):
            order = ["ours", "centrifugo"] if r % 2 == 0 else ["centrifugo", "ours"]
            one: dict[str, dict] = {}
            for side in order:
                log(f"round {r + 1}/{rounds}: {side}")
                one[side] = (run_ours(dbs, entries_file, clients, 1, steps_text, gap, tmp, False, ours_daemons,
                                      client)
                             if side == "ours" else run_centrifugo(clients, 1, steps_text, gap, tmp, client))
                _line(side, one[side])
            results.append(one)
        if overload_steps:
            # Past the knee with the truth behind ours: each message to every one of its user's
            # devices, so the knee comes at a message rate MySQL can commit here.
            for side in ("ours", "centrifugo"):
                log(f"overload, {overload_devices} devices per user: {side}")
                overload[side] = (run_ours(dbs, entries_file, clients, overload_devices, overload_steps, gap, tmp,
                                           True, ours_daemons, client) if side == "ours"
                                  else run_centrifugo(clients, overload_devices, overload_steps, gap, tmp, client))
                _line(side, overload[side])
    summary = summarize(results)
    if overload:
        summary.update(overload_summary(overload))
    return {**summary, "clients": clients, "rounds": results, "overload": overload, "steps": steps_text,
            "where": f"one machine, 2 cores shared by the server, its feed and the load clients ({WHO[client]}, "
                     "the same program for both). Ours: the daemons fed oplog batches by the relay (its real code, "
                     "in a separate process) over its Unix socket; in the overload run each batch is committed to "
                     "MariaDB first. Centrifugo: its memory engine, fed through its HTTP batch API.",
            **machine.describe()}


def overload_summary(overload: dict[str, dict]) -> dict:
    """What the steps past each side's knee lost: ours must lose nothing there."""
    def past(side: str) -> list[dict]:
        knee = overload[side]["knee_rate"]
        return [f for f in overload[side]["steps"] if knee is not None and f["rate"] >= knee]

    ours, theirs = past("ours"), past("centrifugo")
    return {"overload_devices_per_user": overload["ours"]["devices_per_user"],
            "ours_overload_knee": overload["ours"]["knee_rate"],
            "ours_overload_steps_past_knee": len(ours),
            "ours_lost_past_knee": sum(f["lost"] for f in ours),
            "ours_duplicated_overload": overload["ours"]["duplicated"],
            "peer_overload_knee": overload["centrifugo"]["knee_rate"],
            "peer_lost_past_knee": sum(f["lost"] for f in theirs)}


def main(clients: int = typer.Option(10_000), rounds: int = typer.Option(2), steps: str = typer.Option(DEFAULT_STEPS),
         gap: float = typer.Option(3.0, help="seconds between steps"),
         overload_steps: str = typer.Option(OVERLOAD_STEPS, help="empty: no overload run"),
         overload_devices: int = typer.Option(50, help="devices per user in the overload run"),
         ours_daemons: int = typer.Option(OUR_DAEMONS, help="our daemon processes"),
         client: str = typer.Option(DEFAULT_CLIENT, help="the load clients: go (compiled) or python"),
         out: Path = typer.Option(RESULTS / "peers-latest.json")) -> None:
    result = run(clients, rounds, steps, gap, overload_steps, overload_devices, ours_daemons, client)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    peer_report.plot(result, out.with_suffix(".png"))
    keys = ("ours_kb_per_conn", "peer_kb_per_conn", "memory_ratio", "ours_max_rate_p99_100ms",
            "peer_max_rate_p99_100ms", "rate_ratio", "ours_cpu_us_per_msg", "peer_cpu_us_per_msg", "cpu_ratio",
            "ours_server_cpu_us_per_frame", "ours_client_cpu_us_per_frame", "ours_client_bound",
            "peer_server_cpu_us_per_frame", "peer_client_cpu_us_per_frame", "peer_client_bound",
            "ours_lost", "ours_duplicated", "ours_overload_knee", "ours_lost_past_knee", "peer_lost_past_knee")
    for k in keys:
        print(f"{k:28} {result.get(k)}")
    print(f"wrote {out}")
    failed = check(result)
    if failed:
        raise SystemExit(failed)


def check(result: dict) -> str | None:
    """What makes the run fail: ours losing or repeating a message below its knee, or past it with the truth."""
    if result["ours_duplicated"] or result.get("ours_duplicated_overload"):
        return "ours duplicated a message"
    below = [f for r in result["rounds"] for f in r["ours"]["steps"]
             if r["ours"]["knee_rate"] is None or f["rate"] < r["ours"]["knee_rate"]]
    if any(f["lost"] for f in below):
        return "ours lost a message below its knee"
    if result.get("ours_lost_past_knee"):
        return "ours lost a message past its knee, with MySQL behind it"
    return None
