"""One daemon against two on one host, the relay routed by user against whole namespaces, interleaved.

    .venv/bin/python -m loadtest.broker --base /tmp/base --rounds 2

Each run is the peers benchmark's "ours" side (loadtest/peers/scenario.py): the daemons on one
SO_REUSEPORT port, fed by the host's real relay in a separate process (``loadtest.peers.feeder``,
no FerretDB: its tail would cap every run), ``--clients`` WebSockets held by the compiled load
client, a schedule of rising rates. Per run: the sustained rate (p99 < 100 ms, nothing lost),
lost and duplicated frames, each daemon's CPU per message at each step, and its decoded share
(``chat_daemon_oplog_entries_decoded_total`` against the ids it was passed over, scraped from
each daemon before it stops).

``--base`` is a checkout of the code to compare with (``git worktree add /tmp/base <commit>``,
its .venv linked): each run of it starts from that folder, so its daemons and relay are its own.
The rounds alternate the two revisions and the daemon counts; the figures are ratios within the
run. Writes loadtest/results/broker-latest.json.

    python -m loadtest.broker one --daemons 2 --out run.json   (one run, from the current folder)
"""

from __future__ import annotations

import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bson
import httpx
import orjson
import typer
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from loadtest.common import machine
from loadtest.common.results import RESULTS

app = typer.Typer(add_completion=False)
STEPS = "2000x4,4000x4,6000x4,8000x4,10000x4"
HERE = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[broker {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def scrape(port: int) -> dict[str, float]:
    """A daemon's oplog counters, summed over partitions."""
    out: dict[str, float] = {}
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name in ("chat_daemon_oplog_entries_decoded_total", "chat_daemon_oplog_ids_passed_over_total",
                          "chat_daemon_pushes_total"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


@app.command()
def one(daemons: int = typer.Option(1), clients: int = typer.Option(4000), steps: str = typer.Option(STEPS),
        gap: float = typer.Option(2.0), out: Path = typer.Option(...)) -> None:
    """One run of the code in the current folder: ``daemons`` daemons behind the feeder's relay."""
    from harness.servers import env_for, free_port, stop
    from harness.system import databases, wait_listening
    from db.sql import make_engine
    from loadtest import replay
    from loadtest.clients import loadclient
    from loadtest.peers.feeder import parse_steps
    from loadtest.peers.scenario import _measure

    loadclient.install()
    tmp = Path(tempfile.mkdtemp(prefix="broker-"))
    try:
        with databases(tmp / "dbs") as dbs:
            entries_file = tmp / "entries.bson"
            entries_file.write_bytes(b"".join(bson.encode(e) for e in replay.record(dbs.ferretdb.url, 200)))
            engine = make_engine(dbs.mariadb.url(), 10)
            with engine.begin() as conn:
                conn.execute(text("TRUNCATE TABLE messages"))
            engine.dispose()
            sock, port = tmp / "relay.sock", free_port()
            env = env_for(dbs.mariadb, dbs.ferretdb, CHAT_DAEMON_PORT=str(port), CHAT_OPLOG_RELAY_SOCKET=str(sock),
                          CHAT_LOG_LEVEL="WARNING", CHAT_MAX_CONNECTIONS="18000", CHAT_PING_INTERVAL_SECONDS="120",
                          CHAT_FILL_HOLES_FROM_MYSQL="false")
            feed_cmd = [sys.executable, "-m", "loadtest.peers.feeder", "--socket", str(sock), "--entries",
                        str(entries_file), "--mysql-url", "", "--clients", str(clients), "--steps", steps,
                        "--gap", str(gap), "--subscribers", str(daemons)]
            ports = [free_port() for _ in range(daemons)]
            procs = [subprocess.Popen([sys.executable, "-m", "daemon"], env={**env, "CHAT_METRICS_PORT": str(p)},
                                      stdout=sys.stderr, stderr=sys.stderr) for p in ports]
            scraped: list[dict[str, float]] = []
            try:
                for proc in procs:
                    wait_listening(proc, port, 30)
                result = _measure("ours", [p.pid for p in procs], [], feed_cmd, env, "127.0.0.1", port,
                                  env["CHAT_JWT_SECRET"], clients, 1, parse_steps(steps), gap, tmp, "go")
                scraped = [scrape(p) for p in ports]
            finally:
                for proc in procs:
                    stop(proc, signal.SIGTERM)
        result["daemons"] = daemons
        result["per_daemon"] = [{
            "decoded": s.get("chat_daemon_oplog_entries_decoded_total", 0.0),
            "passed_over": s.get("chat_daemon_oplog_ids_passed_over_total", 0.0),
            "pushes": s.get("chat_daemon_pushes_total", 0.0)} for s in scraped]
        out.write_bytes(orjson.dumps(result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def figures(run: dict, cpu_step: float) -> dict:
    """What the comparison keeps of one run; the daemons' CPU per message (summed) at the step of ``cpu_step`` msg/s."""
    per = run["per_daemon"]
    at: dict = next((s for s in run["steps"] if s.get("rate") == cpu_step), {})
    shares = [round(d["decoded"] / max(1.0, d["decoded"] + d["passed_over"]), 3) for d in per]
    pushes = sum(d["pushes"] for d in per)
    return {
        "daemons": run["daemons"], "sustained_msg_s": run["max_rate_p99_100ms"], "knee_msg_s": run["knee_rate"],
        "lost": run["lost"], "duplicated": run["duplicated"],
        "server_cpu_us_per_msg_at_sustained": (run.get("cpu_us_per_msg") or {}).get("server"),
        "daemon_cpu_us_per_msg": (at.get("cpu_us_per_msg") or {}).get("server"),
        "decoded_share": shares,
        "push_share": [round(d["pushes"] / max(1.0, pushes), 3) for d in per],
        "steps": [{k: s.get(k) for k in ("rate", "delivered", "lost", "p50_ms", "p99_ms", "cpu_us_per_msg")}
                  for s in run["steps"]],
    }


@app.command()
def compare(base: Path = typer.Option(..., help="a checkout of the revision to compare with"),
            rounds: int = typer.Option(2), clients: int = typer.Option(4000), steps: str = typer.Option(STEPS),
            gap: float = typer.Option(2.0),
            cpu_step: float = typer.Option(4000.0, help="the step whose CPU is compared"),
            out: Path = typer.Option(RESULTS / "broker-latest.json")) -> None:
    """Both revisions, one daemon and two, interleaved ``rounds`` times."""
    shutil.copy(Path(__file__), base / "loadtest" / "broker.py")  # the same driver in both folders
    revisions = {"base": base, "routed_by_user": HERE}
    commits = {k: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                 text=True).stdout.strip() for k, root in revisions.items()}
    runs: dict[str, dict[int, list[dict]]] = {k: {1: [], 2: []} for k in revisions}
    tmp = Path(tempfile.mkdtemp(prefix="broker-cmp-"))
    for r in range(rounds):
        order = list(revisions) if r % 2 == 0 else list(reversed(revisions))
        for daemons in ((1, 2) if r % 2 == 0 else (2, 1)):
            for rev in order:
                log(f"round {r + 1}/{rounds}: {rev}, {daemons} daemon(s)")
                path = tmp / f"{rev}-{daemons}-{r}.json"
                subprocess.run([str(HERE / ".venv" / "bin" / "python"), "-m", "loadtest.broker", "one",
                                "--daemons", str(daemons), "--clients", str(clients), "--steps", steps,
                                "--gap", str(gap), "--out", str(path)], cwd=revisions[rev], check=True)
                fig = figures(orjson.loads(path.read_bytes()), cpu_step)
                runs[rev][daemons].append(fig)
                log(f"  sustained {fig['sustained_msg_s']} msg/s, lost {fig['lost']}, dup {fig['duplicated']}, "
                    f"daemon CPU {fig['daemon_cpu_us_per_msg']} us/msg, decoded {fig['decoded_share']}")

    def med(rev: str, daemons: int, key: str) -> float | None:
        values = [f[key] for f in runs[rev][daemons] if f[key] is not None]
        return statistics.median(values) if values else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    summary = {}
    for rev in revisions:
        one_rate, two_rate = med(rev, 1, "sustained_msg_s"), med(rev, 2, "sustained_msg_s")
        one_cpu, two_cpu = (med(rev, 1, "daemon_cpu_us_per_msg"),
                            med(rev, 2, "daemon_cpu_us_per_msg"))
        summary[rev] = {"sustained_one": one_rate, "sustained_two": two_rate,
                        "two_over_one_rate": ratio(two_rate, one_rate),
                        "daemon_cpu_us_per_msg_one": one_cpu, "daemon_cpu_us_per_msg_two_summed": two_cpu,
                        "two_over_one_cpu_per_msg": ratio(two_cpu, one_cpu),
                        "lost": sum(f["lost"] for d in (1, 2) for f in runs[rev][d]),
                        "duplicated": sum(f["duplicated"] for d in (1, 2) for f in runs[rev][d])}
    summary["after_over_before"] = {
        "two_daemons_cpu_per_msg": ratio(summary["routed_by_user"]["daemon_cpu_us_per_msg_two_summed"],
                                         summary["base"]["daemon_cpu_us_per_msg_two_summed"]),
        "one_daemon_cpu_per_msg": ratio(summary["routed_by_user"]["daemon_cpu_us_per_msg_one"],
                                        summary["base"]["daemon_cpu_us_per_msg_one"]),
        "two_daemons_sustained": ratio(summary["routed_by_user"]["sustained_two"], summary["base"]["sustained_two"]),
    }
    result = {"summary": summary, "runs": runs, "commits": commits, "clients": clients, "steps": steps,
              "rounds": rounds, "cpu_step_msg_s": cpu_step,
              "where": "one machine, 2 shared cores: the daemons, the feeder's relay (real code, separate process, "
                       "no MySQL commit, no FerretDB tail) and the compiled load client, all on them; FerretDB 1.24 "
                       "only records the entries' shape, not MongoDB",
              **machine.describe()}
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    print(f"wrote {out}")


if __name__ == "__main__":
    app()
