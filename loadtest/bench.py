"""`make bench` (quick, < 5 min) and `make bench-full`: every benchmark, one report.

Starts its own private MariaDB, FerretDB, API and daemons on free ports
(loopback only), runs bounded scenarios, checks what it sent (a run that
loses or duplicates a message fails loudly), and writes latest.json,
report.md and PNG plots. Into var/bench/ (git-ignored) unless ``--publish``:
only a publishing run rewrites loadtest/results/ and docs/benchmarks.md, so
a newcomer's `make bench` leaves the published figures as they are.
"""

from __future__ import annotations

import configparser
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import httpx
import orjson
import typer

from loadtest.common import ab
from loadtest.common import machine
from loadtest.million import scenario as million
from loadtest.peers import report as peer_report
from loadtest.peers import scenario as peers
from loadtest import replay
from loadtest.common import scrape
from loadtest import wsload
from loadtest.common.results import DOCS, RESULTS, UNPUBLISHED
from loadtest.report.write import PLOTS, write_report
from harness.servers import ROOT
from harness.system import Databases, System, databases, running_system



def _deployed(program: str) -> int:
    """How many processes of ``program`` `make run` starts (supervisord.conf):
    the whole-system scenarios run as deployed."""
    conf = configparser.RawConfigParser()
    conf.read(ROOT / "supervisord.conf")
    if not conf.has_section(f"program:{program}"):
        return 0
    return conf.getint(f"program:{program}", "numprocs", fallback=1)


DEPLOYED_APIS, DEPLOYED_DAEMONS = _deployed("api"), _deployed("daemon")
DEPLOYED_WRITER = _deployed("writer") == 1  # the API processes write through the host's writer process
DEPLOYED_RELAY = _deployed("relay") == 1  # the daemons tail the oplog through the host's relay


class Deployment(TypedDict):
    """``running_system``'s API, writer and relay processes, as `make run` starts them."""
    apis: int
    writer: bool
    relay: bool


class ScenarioEnv(TypedDict):
    """The settings every whole-system scenario here runs with (environment variables)."""
    CHAT_RATE_LIMIT_PER_SECOND: str
    CHAT_LOG_LEVEL: str
    CHAT_WRITER_QUEUE_MAX: str


AS_DEPLOYED = Deployment(apis=DEPLOYED_APIS, writer=DEPLOYED_WRITER, relay=DEPLOYED_RELAY)
SEED = {  # the seed experiment: phpDaemon / Node.js behind ab -k, requests/s
    10: (54.36, 64.0), 100: (75.15, 64.12), 500: (67.73, 61.71), 1000: (56.99, 75.02)}

app = typer.Typer(add_completion=False)


def log(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


def check(result: dict, what: str) -> None:
    """A run that lost or duplicated a message is marked FAILED in the results
    and the report, and the whole benchmark exits non-zero once the other
    scenarios have run: loud, but the rest of the figures are not thrown away."""
    try:
        wsload.verify(result, what)
    except SystemExit as failed:
        log(str(failed))
        result["failed"] = str(failed)


def failures(results: dict) -> list[str]:
    runs = [*results["replay"], *results["ws"], *results.get("rates", []),
            *([results["hold"]] if "hold" in results else []), *([results["million"]] if "million" in results else []),
            *([results["peers"]] if "peers" in results else [])]
    return [run["failed"] for run in runs if "failed" in run]


class Writer(threading.Thread):
    """Posts messages to one user at a fixed rate through the API while ab runs."""

    def __init__(self, system: System, to: str, rate: float):
        super().__init__(daemon=True)
        self.system, self.to, self.rate, self.sent = system, to, rate, 0
        self.stop = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.system.token('bench-writer')}"}
        with httpx.Client(timeout=10) as c:
            start = time.monotonic()
            while not self.stop.is_set():
                c.post(f"{self.system.api_url}/v1/messages", headers=headers, json={"to": self.to, "body": "tick"})
                self.sent += 1
                time.sleep(max(0.0, start + self.sent / self.rate - time.monotonic()))


def post_body() -> Path:
    """The file ab posts: one typical short message to the long-poll reader."""
    body = Path(tempfile.mkdtemp()) / "body.json"
    body.write_text('{"to": "ab-reader", "body": "hello from ab, a typical short chat message"}')
    return body


def ab_matrix(system: System, levels: list[int], seconds: float, iterations: int,
              poll_rate: int) -> dict[str, list[dict]]:
    body = post_body()
    out: dict[str, list[dict]] = {"post": [], "poll": []}
    # Long-polls first, on a settled system: after the POST flood the daemons
    # are still reading tens of thousands of messages back from FerretDB.
    reader = system.token("ab-reader")
    for c in levels:
        runs = []
        for i in range(iterations):
            # ab repeats one URL, so every poll asks for the same messages since
            # one cursor: the first message stored before ab starts means every
            # poll answers at once, as for a client that is behind and pages
            # through. `limit` = one second of the writer's messages: without it
            # answers grew to the whole run's messages (400 in 20 s), which no
            # client that follows its cursor ever gets.
            cursor = httpx.get(f"{system.poll_url}?timeout=0",
                               headers={"Authorization": f"Bearer {reader}"}).json()["cursor"]
            writer = Writer(system, "ab-reader", poll_rate)
            writer.start()
            while writer.sent < 1 and writer.is_alive():
                time.sleep(0.01)
            time.sleep(1.0)  # every daemon's tail past the cursor: no poll waits for its daemon to catch up
            log(f"ab GET /v1/poll -c {c} -t {seconds} while a writer posts {poll_rate}/s ({i + 1}/{iterations})")
            runs.append(ab.run(f"{system.poll_url}?since={cursor}&timeout=1&limit={poll_rate}", c, seconds, reader))
            writer.stop.set()
            writer.join()
        row = average(c, runs)
        row["seed_rps"] = SEED.get(c)
        row["ratio_vs_best_seed"] = round(row["rps"] / max(SEED[c]), 1) if c in SEED else None
        out["poll"].append(row)
    for c in levels:
        runs = []
        for i in range(iterations):
            log(f"ab POST /v1/messages -c {c} -t {seconds} ({i + 1}/{iterations})")
            runs.append(ab.run(f"{system.api_url}/v1/messages", c, seconds, system.token("ab-writer"), body))
        out["post"].append(average(c, runs))
    return out


def post_alone(levels: list[int], seconds: float, iterations: int, env: ScenarioEnv) -> list[dict]:
    """ab on POST /v1/messages with the write path by itself: one API process
    writing for itself, and the API tier as deployed (its processes and the
    writer process), with MariaDB and FerretDB, no daemon. Each daemon's oplog
    tail costs FerretDB CPU per message (docs/capacity.md) that the API would
    otherwise have; the matrix above runs with them, as deployed."""
    body = post_body()
    out = []
    for apis, writer in ((1, False), (DEPLOYED_APIS, DEPLOYED_WRITER)):
        with databases(Path(tempfile.mkdtemp(prefix="bench-post-"))) as dbs:
            with running_system(dbs, daemons=0, apis=apis, writer=writer, **env) as system:
                for c in levels:
                    runs = []
                    for i in range(iterations):
                        log(f"ab POST /v1/messages -c {c} -t {seconds}, {apis} API process(es), no daemon "
                            f"({i + 1}/{iterations})")
                        runs.append(ab.run(f"{system.api_url}/v1/messages", c, seconds, system.token("ab-writer"),
                                           body))
                    out.append({**average(c, runs), "apis": apis, "writer": writer})
    return out


def average(c: int, runs: list[dict]) -> dict:
    keys = ["complete", "rps", "tpr_all_ms", "min_ms", "p50_ms", "p99_ms", "max_ms", "errors"]
    row = {k: round(sum(r[k] for r in runs) / len(runs), 2) for k in keys}
    row["max_ms"] = max(r["max_ms"] for r in runs)
    row.update(concurrency=c, iterations=len(runs), command=runs[0]["command"])
    return row


@contextlib.contextmanager
def database_alone(system: System, seconds: float, result: dict) -> Iterator[None]:
    """FerretDB's own insert -> tail latency and the cores it used, over the
    send window only. Started with the run instead, the
    probe spent most of its time in the clients' connection phase, 14-28 s at
    10k clients, with no message traffic: the database's share was measured
    on a quieter FerretDB than the one our messages went through."""
    # Its own process: in this one it would share the GIL with the sender. It
    # inserts after about a second (its start-up, and half a second for its
    # tail to open): one second less keeps its samples inside the window.
    prober = subprocess.Popen([sys.executable, "-m", "loadtest.common.probe", system.dbs.ferretdb.url, "20",
                               str(max(1.0, seconds - 1))], stdout=subprocess.PIPE)
    # its tails' polling spends most of FerretDB's share of the machine, whatever the rate
    ferretdb = machine.ProcessCpu([machine.pid_of(system.dbs.ferretdb.proc)])
    try:
        yield
    finally:
        result["ferretdb_cores"] = ferretdb.cores()
        try:
            samples = orjson.loads(prober.communicate(timeout=120)[0] or b"[]")
        except subprocess.TimeoutExpired:  # said in the report as "no samples", never a crash of the whole run
            prober.kill()
            samples = []
        result["ferretdb_tail_ms"] = wsload.percentiles(samples)


def ws_runs(system: System, sizes: list[int], rate: float, seconds: float) -> list[dict]:
    out = []
    name = "chat_daemon_oplog_to_socket_seconds"
    daemons = sum(1 for n in system.procs if n.startswith("daemon"))
    metrics_url = f"http://127.0.0.1:{system.daemon_port}/metrics"
    # The writer process's own: each message's created_at -> its Mongo insert returned.
    writer_url = f"http://127.0.0.1:{system.writer_metrics_port}/metrics" if "writer" in system.procs else None
    lag_name = "chat_writer_mongo_lag_seconds"
    for n in sizes:
        log(f"WebSocket load: {n} clients, {rate} msg/s for {seconds} s")
        before = scrape.histograms(metrics_url, name, daemons)
        lag_before = scrape.histograms(writer_url, lag_name, 1) if writer_url else {}
        database: dict = {}
        result = wsload.run(system, n, rate, seconds, alongside=database_alone(system, seconds, database))
        result.update(database)
        fanout = scrape.merged_delta(before, scrape.histograms(metrics_url, name, daemons))
        result["fanout_ms"] = _quantiles_ms(fanout)
        if writer_url:
            lag = scrape.merged_delta(lag_before, scrape.histograms(writer_url, lag_name, 1))
            result["mongo_lag_ms"] = _quantiles_ms(lag, scrape.quantile_interpolated)
        log(f"  -> {orjson.dumps(result).decode()}")
        check(result, f"WebSocket load at {n} clients")
        out.append(result)
    return out


def _quantiles_ms(buckets: dict[float, float],
                  quantile: Callable[[dict[float, float], float], float | None] = scrape.quantile,
                  ) -> dict[str, float | None]:
    return {q: (None if (v := quantile(buckets, p)) is None else round(v * 1000, 2))
            for q, p in (("p50", .5), ("p99", .99))}


def rate_runs(system: System, clients: int, rates: Sequence[float], seconds: float) -> list[dict]:
    """The whole system through FerretDB at rising message rates: which part
    of the delivery time grows with the rate, ours or the database's."""
    return [run for rate in rates for run in ws_runs(system, [clients], rate, seconds)]


def replay_runs(clients: int, rates: Sequence[float], seconds: float, max_count: int, daemons: int) -> list[dict]:
    """The daemon tier alone, fed recorded oplog entries (loadtest/replay.py):
    latency at each rate, then throughput as fast as it goes, with every
    message to two connections (recipient and sender) and then to one (the
    senders offline: Centrifugo's unit, a publication to one user's channel)."""
    out = []
    for rate, offline in [*((r, False) for r in rates), (0, False), (0, True)]:
        count = int(rate * seconds) if rate else max_count
        what = f"{rate or 'max'} msg/s{', senders offline' if offline else ''}"
        log(f"replayed oplog: {clients} clients, {daemons} daemon(s), {what}, {count} messages")
        result = replay.bench(clients, rate, count, daemons, replay.tick_batch(rate), senders_offline=offline)
        log(f"  -> {orjson.dumps(result).decode()}")
        check(result, f"replay at {what}")
        out.append(result)
    return out


def hold_run(dbs: Databases, clients: int, daemons: int, rate: float, seconds: float) -> dict:
    """Many idle clients over several daemons (each under the 20k open-files
    limit), with messages flowing through the whole system meanwhile."""
    log(f"holding {clients} WebSocket clients on {daemons} daemons, {rate} msg/s for {seconds} s")
    with running_system(dbs, daemons=daemons, apis=1, relay=DEPLOYED_RELAY, CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_LOG_LEVEL="WARNING") as s:
        result = wsload.run(s, clients, rate, seconds)
    log(f"  -> {orjson.dumps(result).decode()}")
    check(result, f"hold of {clients}")
    return result


def million_run(target: int, seconds: float, ping_seconds: float, out: Path) -> dict:
    """``loadtest.million``: ``target`` connections held, messages through the
    API meanwhile, one daemon restarted; its own JSON and PNG at ``out``."""
    log(f"million: {target} WebSocket connections, 100 msg/s for {seconds} s, one daemon restarted")
    result = million.run(target, 1 + -(-target // million.PER_DAEMON), 100.0, seconds,
                         [0.1, 0.25, 0.5, 0.75, 1.0] if target > 100_000 else [0.5, 1.0], 1.5,
                         {"CHAT_PING_INTERVAL_SECONDS": f"{ping_seconds:g}"}, idle_seconds=10 if seconds > 30 else 3)
    million.publish(result, out)
    failed = million.check(result)
    if failed:
        result["failed"] = f"FAILED million: {failed}"
        log(result["failed"])
    return {k: v for k, v in result.items() if k not in ("steps", "machine")}


def peers_run(clients: int, rounds: int, steps: str, overload_steps: str, out: Path) -> dict:
    """``loadtest.peers``: our daemon and Centrifugo 5.4.9 in one run, the same clients; its own JSON at ``out``."""
    log(f"peers: ours and Centrifugo 5.4.9, {clients} clients, {rounds} rounds, then overload")
    result = peers.run(clients, rounds, steps, 3.0, overload_steps, 50)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    peer_report.plot(result, out.with_suffix(".png"))
    failed = peers.check(result)
    if failed:
        result["failed"] = f"FAILED peers: {failed}"
        log(result["failed"])
    return {k: v for k, v in result.items() if k not in ("rounds", "overload")}


@dataclass(frozen=True)
class Outputs:
    """Where a run writes: its folder, the million and peers scenarios' own
    JSON (each with a PNG beside it), and the docs page whose generated
    tables it rewrites (a publishing run only)."""
    folder: Path
    million: Path
    peers: Path
    docs: Path | None

    def files(self) -> list[Path]:
        """Every file the run may write."""
        own = [self.folder / "latest.json", self.folder / "report.md", *(self.folder / name for name in PLOTS)]
        scenarios = [path for json in (self.million, self.peers) for path in (json, json.with_suffix(".png"))]
        return own + scenarios + ([self.docs] if self.docs else [])


def outputs(full: bool, publish: bool, folder: Path | None = None) -> Outputs:
    """A publishing run writes loadtest/results/ and docs/benchmarks.md; any
    other run writes var/bench/ (or ``folder``), which git ignores."""
    folder = folder or (RESULTS if publish else UNPUBLISHED)
    mode = "latest" if full else "quick"
    return Outputs(folder, folder / f"million-{mode}.json", folder / f"peers-{mode}.json", DOCS if publish else None)


@app.command()
def main(quick: bool = typer.Option(False, "--quick"), full: bool = typer.Option(False, "--full"),
         publish: bool = typer.Option(False, "--publish", help="write loadtest/results/ and docs/benchmarks.md "
                                      "(the published figures) instead of var/bench/"),
         out_dir: Path | None = typer.Option(None, help="where the run's files go (default: var/bench/, or "
                                             "loadtest/results/ with --publish)"),
         only: list[str] = typer.Option([], "--only", help="rerun just these sections (replay, ws, rates, ab, "
                                        "post_alone, hold, million, peers) into the existing latest.json; "
                                        "the report says which and when")) -> None:
    sections = set(only) or {"replay", "ws", "rates", "ab", "post_alone", "hold", "million", "peers"}
    out = outputs(full, publish, out_dir)
    if full:
        levels, seconds, iterations = [10, 100, 500, 1000], 20, 5
        sizes, rate, ws_seconds, daemons = [100, 1000, 10_000], 1000, 20, DEPLOYED_DAEMONS
        replay_clients, replay_rates, replay_max = 10_000, [1000, 2000, 5000, 10_000], 200_000
        hold = (100_000, 8, 100, 20)  # clients, daemons, msg/s, seconds
        rates = (1000, [100, 250, 500, 1000], 15)  # clients, msg/s, seconds
        post_alone_matrix = ([100, 1000], 20, 3)  # levels, seconds, iterations
        # connections, seconds of messages, ping interval: at 20 s, a million sockets' pings alone
        # would take more than the 2 cores (docs/decisions/million-connections.md)
        million_args = (1_000_000, 60.0, 120.0, out.million)
        peers_args = (10_000, 2, peers.DEFAULT_STEPS, peers.OVERLOAD_STEPS, out.peers)
    else:
        levels, seconds, iterations = [10, 100, 500, 1000], 5, 1
        sizes, rate, ws_seconds, daemons = [100, 1000], 200, 10, DEPLOYED_DAEMONS
        replay_clients, replay_rates, replay_max = 2000, [1000, 2000, 5000], 50_000
        hold = None
        rates = None  # the full run's; the quick one keeps under 5 minutes
        post_alone_matrix = ([100], 5, 1)
        million_args = (10_000, 10.0, 20.0, out.million)
        peers_args = (2_000, 1, "2000x3,5000x3,10000x3", "100x3,200x3,400x3", out.peers)
    if only:
        results = orjson.loads((out.folder / "latest.json").read_bytes())
        results.setdefault("reruns", {}).update({name: machine.describe() for name in only})
    else:
        results = {"machine": machine.describe(), "mode": "full" if full else "quick"}
    if "replay" in sections:
        results["replay"] = replay_runs(replay_clients, replay_rates, 5 if not full else 10, replay_max, 1)
    env = ScenarioEnv(CHAT_RATE_LIMIT_PER_SECOND="0", CHAT_LOG_LEVEL="WARNING", CHAT_WRITER_QUEUE_MAX="50000")
    # Each on fresh databases: FerretDB scans `messages` whole for a daemon's
    # catch-up, so one scenario's leftovers (or a run that fell behind) would
    # weigh on the next one's figures.
    if "ws" in sections:
        with databases(Path(tempfile.mkdtemp(prefix="bench-"))) as dbs:
            with running_system(dbs, daemons=daemons, **AS_DEPLOYED, **env) as system:
                results["ws"] = ws_runs(system, sizes, rate, ws_seconds)
            results.setdefault("deployed", {})["ws"] = {**AS_DEPLOYED, "daemons": daemons}
    if rates is None and "rates" in only:
        log("the rates section runs with --full only")
    if rates is not None and "rates" in sections:
        with databases(Path(tempfile.mkdtemp(prefix="bench-rates-"))) as dbs:
            with running_system(dbs, daemons=daemons, **AS_DEPLOYED, **env) as system:
                results["rates"] = rate_runs(system, *rates)
            results.setdefault("deployed", {})["rates"] = {**AS_DEPLOYED, "daemons": daemons}
    if "ab" in sections:
        with databases(Path(tempfile.mkdtemp(prefix="bench-ab-"))) as dbs:
            with running_system(dbs, daemons=daemons, **AS_DEPLOYED, **env) as system:
                results["ab"] = ab_matrix(system, levels, seconds, iterations, poll_rate=20)
            results.setdefault("deployed", {})["ab"] = {**AS_DEPLOYED, "daemons": daemons}
    if "post_alone" in sections:
        results["post_alone"] = post_alone(*post_alone_matrix, env)
    if hold is not None and "hold" in sections:
        with databases(Path(tempfile.mkdtemp(prefix="bench-hold-"))) as dbs:
            results["hold"] = hold_run(dbs, *hold)
    if "million" in sections:
        results["million"] = million_run(*million_args)
    if "peers" in sections:
        results["peers"] = peers_run(*peers_args)
    results["failures"] = failures(results)
    out.folder.mkdir(parents=True, exist_ok=True)
    (out.folder / "latest.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    write_report(results, out.folder, out.docs)
    log(f"wrote {out.folder}/latest.json, report.md and plots" + (f", and {out.docs}" if out.docs else
        " (the published figures are left alone: --publish writes them)"))
    print((out.folder / "report.md").read_text())
    if results["failures"]:
        raise SystemExit("FAILED: " + "; ".join(results["failures"]))


if __name__ == "__main__":
    sys.exit(app())
