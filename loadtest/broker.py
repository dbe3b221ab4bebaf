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

import gc
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
            runs_dir: Path | None = typer.Option(None, help="where each run's JSON goes (kept); default: a temp dir"),
            also: list[Path] = typer.Option([], help="folders of earlier runs of the same revisions to count too"),
            out: Path = typer.Option(RESULTS / "broker-latest.json")) -> None:
    """Both revisions, one daemon and two, interleaved ``rounds`` times."""
    shutil.copy(Path(__file__), base / "loadtest" / "broker.py")  # the same driver in both folders
    revisions = {"base": base, "routed_by_user": HERE}
    commits = {k: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                 text=True).stdout.strip() for k, root in revisions.items()}
    folder = runs_dir or Path(tempfile.mkdtemp(prefix="broker-cmp-"))
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(rounds):
        order = list(revisions) if r % 2 == 0 else list(reversed(revisions))
        for daemons in ((1, 2) if r % 2 == 0 else (2, 1)):
            for rev in order:
                log(f"round {r + 1}/{rounds}: {rev}, {daemons} daemon(s)")
                path = folder / f"{rev}-{daemons}-{r}.json"
                subprocess.run([str(HERE / ".venv" / "bin" / "python"), "-m", "loadtest.broker", "one",
                                "--daemons", str(daemons), "--clients", str(clients), "--steps", steps,
                                "--gap", str(gap), "--out", str(path)], cwd=revisions[rev], check=True)
                fig = figures(orjson.loads(path.read_bytes()), cpu_step)
                log(f"  sustained {fig['sustained_msg_s']} msg/s, lost {fig['lost']}, dup {fig['duplicated']}, "
                    f"daemon CPU {fig['daemon_cpu_us_per_msg']} us/msg, decoded {fig['decoded_share']}")
    result = summarize([*also, folder], list(revisions), cpu_step)
    result.update(commits=commits, clients=clients, steps=steps, cpu_step_msg_s=cpu_step,
                  where="one machine, 2 shared cores (other work ran beside): the daemons, the feeder's relay (real "
                        "code, separate process, no MySQL commit, no FerretDB tail) and the compiled load client, "
                        "all on them; FerretDB 1.24, not MongoDB, only recorded the entries' shape",
                  **machine.describe())
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(result["summary"], option=orjson.OPT_INDENT_2).decode())
    print(f"wrote {out}")


def summarize(folders: list[Path], revisions: list[str], cpu_step: float) -> dict:
    """The medians per revision and daemon count over every run in ``folders`` (``{rev}-{daemons}-{round}.json``)."""
    runs: dict[str, dict[str, list[dict]]] = {rev: {"1": [], "2": []} for rev in revisions}
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            rev, daemons, _ = path.stem.rsplit("-", 2)
            runs[rev][daemons].append(figures(orjson.loads(path.read_bytes()), cpu_step))

    def med(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 2) if values else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    def cpu_by_rate(rev: str, daemons: str) -> dict[str, float | None]:
        rates = sorted({s["rate"] for f in runs[rev][daemons] for s in f["steps"]})
        return {f"{rate:g}": med([s["cpu_us_per_msg"]["server"] for f in runs[rev][daemons] for s in f["steps"]
                                 if s["rate"] == rate and s.get("cpu_us_per_msg")]) for rate in rates}

    summary: dict = {}
    for rev in revisions:
        one_rate = med([f["sustained_msg_s"] for f in runs[rev]["1"]])
        two_rate = med([f["sustained_msg_s"] for f in runs[rev]["2"]])
        one_cpu = med([f["daemon_cpu_us_per_msg"] for f in runs[rev]["1"]])
        two_cpu = med([f["daemon_cpu_us_per_msg"] for f in runs[rev]["2"]])
        summary[rev] = {"runs_per_count": len(runs[rev]["1"]), "sustained_one": one_rate, "sustained_two": two_rate,
                        "two_over_one_rate": ratio(two_rate, one_rate),
                        "daemon_cpu_us_per_msg_one": one_cpu, "daemon_cpu_us_per_msg_two_summed": two_cpu,
                        "two_over_one_cpu_per_msg": ratio(two_cpu, one_cpu),
                        "cpu_us_per_msg_by_rate_one": cpu_by_rate(rev, "1"),
                        "cpu_us_per_msg_by_rate_two": cpu_by_rate(rev, "2"),
                        "decoded_share_two": [f["decoded_share"] for f in runs[rev]["2"]],
                        "lost": sum(f["lost"] for d in ("1", "2") for f in runs[rev][d]),
                        "duplicated": sum(f["duplicated"] for d in ("1", "2") for f in runs[rev][d])}
    if "base" in summary and "routed_by_user" in summary:
        after, before = summary["routed_by_user"], summary["base"]
        summary["after_over_before"] = {
            "two_daemons_cpu_per_msg": ratio(after["daemon_cpu_us_per_msg_two_summed"],
                                             before["daemon_cpu_us_per_msg_two_summed"]),
            "one_daemon_cpu_per_msg": ratio(after["daemon_cpu_us_per_msg_one"], before["daemon_cpu_us_per_msg_one"]),
            "two_daemons_sustained": ratio(after["sustained_two"], before["sustained_two"]),
        }
    return {"summary": summary, "runs": runs}


@app.command("summarize")
def summarize_command(folders: list[Path], cpu_step: float = typer.Option(4000.0),
                      out: Path = typer.Option(RESULTS / "broker-latest.json")) -> None:
    """Rebuilds the result from kept runs (``compare --runs-dir``)."""
    result = summarize(folders, ["base", "routed_by_user"], cpu_step)
    result.update(cpu_step_msg_s=cpu_step, **machine.describe())
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(result["summary"], option=orjson.OPT_INDENT_2).decode())


def _frames(clients: int, count: int, batch: int, held: set[str] | None) -> tuple[list[bytes], float]:
    """The relay's frames for one daemon holding ``held`` (None: whole namespaces), and the relay's
    CPU seconds to make them for a host of daemons that share the users in halves (or, whole, for one)."""
    from loadtest.hotpath import oplog_batches
    from relay.protocol import slim
    from relay.routing import batch_frame, cut, part_of

    ns = "chat.messages"
    batches = [[{**e, "ts": bson.Timestamp(1, e["o"]["_id"])} for e in b.entries]
               for b in oplog_batches(clients, count, batch)]
    halves = [{f"r{i}" for i in range(clients) if i % 2 == k} for k in (0, 1)]
    out: list[bytes] = []
    cpu = time.process_time()
    for entries in batches:
        part = part_of(ns, entries, [bson.encode(slim(e)) for e in entries])
        if held is None:
            out.append(part.whole)
            continue
        for users in halves:  # what the relay does for each of two daemons
            frame = batch_frame(ns, part.last_ts, *cut(part, users))
            if users == held:
                out.append(frame)
    return out, time.process_time() - cpu


def _daemon_cpu(clients: int, count: int, frames: list[bytes], held: set[str]) -> tuple[float, int]:
    """A daemon's CPU seconds to decode ``frames`` as RelayTail does and take them (Consumer.take),
    each batch then checked as MySQL's answer is (the digest of what is held, as
    ``TruthReader.fill`` computes it, with no query) and released; its connections
    those of ``held``; and the frames it wrote."""
    import asyncio
    from types import SimpleNamespace

    from bson.codec_options import CodecOptions

    from chat.settings import Settings
    from daemon.connection import Connection, ServerState
    from daemon.hub import Hub, Subscriber
    from daemon.passed import digest_of
    from daemon.stream import Stream
    from loadtest.hotpath import CountingTransport, Unrouted, frame_ids
    from oplog.events import Batch

    async def run() -> tuple[float, int]:
        settings = Settings()
        hub = Hub(settings.daemon.send_buffer_max_bytes)
        state, handler = ServerState(settings), Unrouted()
        transports = []
        for user in sorted(held):
            conn = Connection(state, handler)
            transport = CountingTransport()
            conn.transport, conn.http = transport, None
            conn.subscriber = Subscriber(conn, user)
            conn.subscriber.pending = None
            transports.append(transport)
            hub.register(conn.subscriber)
        stream = Stream(None, SimpleNamespace(namespace="chat.messages"), hub,  # type: ignore[arg-type]
                        retention_seconds=settings.stores.retention_seconds,
                        cache_max=settings.daemon.recent_cache_max, gap_check_seconds=3600,
                        cache_max_bytes=settings.daemon.recent_cache_max_bytes,
                        ranges=object())  # type: ignore[arg-type]  # checked by MySQL: never queried here
        consumer = stream.consumer
        codec: CodecOptions = CodecOptions(tz_aware=False)
        gc.collect()
        cpu = time.process_time()
        for data in frames:
            message = bson.decode(data, codec_options=codec)
            if "ns" in message:
                event = Batch(message["b"], bytes(message["p"]), message["ns"], message["ts"])
            else:
                event = Batch(message["b"])
            consumer.take(event, time.perf_counter())
            if (hole := consumer.seq.hole) is not None:  # what one read of MySQL settles (TruthReader.fill)
                digest_of(consumer.seq.held_upto(hole[1]))
                consumer.release_held(consumer.seq.confirm(hole[1]))
            await asyncio.sleep(0)  # the loop's turn between two relay frames: what is corked is written
        cpu = time.process_time() - cpu
        if stream.position != count:
            raise SystemExit(f"broker hotpath: released {stream.position} of {count}")
        return cpu, sum(len(frame_ids(t.written)) for t in transports)

    return asyncio.run(run())


@app.command()
def hotpath(clients: int = typer.Option(10_000), count: int = typer.Option(100_000), batch: int = typer.Option(100),
            rounds: int = typer.Option(3), out: Path = typer.Option(RESULTS / "broker-hotpath.json")) -> None:
    """CPU per message of the stream, no socket: the relay's (route and frame for two daemons, or
    one whole frame) and one daemon's (decode its frames and take them), holding all the users or
    half of them, whole namespaces against routed by user, interleaved ``rounds`` times."""
    everyone = {f"r{i}" for i in range(clients)}
    half = {f"r{i}" for i in range(clients) if i % 2 == 0}
    cases = {"whole_all_users": (None, everyone), "whole_half_users": (None, half),
             "routed_half_users": (half, half)}
    got: dict[str, dict[str, list[float]]] = {k: {"relay": [], "daemon": [], "frames": []} for k in cases}
    for r in range(rounds):
        for name in (list(cases) if r % 2 == 0 else list(reversed(cases))):
            routed, held = cases[name]
            frames, relay_cpu = _frames(clients, count, batch, routed)
            daemon_cpu, written = _daemon_cpu(clients, count, frames, held)
            got[name]["relay"].append(round(relay_cpu / count * 1e6, 2))
            got[name]["daemon"].append(round(daemon_cpu / count * 1e6, 2))
            got[name]["frames"].append(written)
    best = {k: {"relay_us_per_msg": min(v["relay"]), "daemon_us_per_msg": min(v["daemon"]),
                "frames": v["frames"][0]} for k, v in got.items()}
    two_whole = 2 * best["whole_half_users"]["daemon_us_per_msg"]
    two_routed = 2 * best["routed_half_users"]["daemon_us_per_msg"]
    one = best["whole_all_users"]["daemon_us_per_msg"]
    result = {
        "clients": clients, "messages": count, "batch": batch, "rounds": got, "best": best,
        "two_daemons_summed_us_per_msg": {"whole": round(two_whole, 2), "routed": round(two_routed, 2)},
        "two_over_one_daemon_cpu": {"whole": round(two_whole / one, 2), "routed": round(two_routed / one, 2)},
        "relay_routed_over_whole": round(best["routed_half_users"]["relay_us_per_msg"]
                                         / best["whole_all_users"]["relay_us_per_msg"], 2),
        "what": "CPU per message of the stream, no socket write, one process (loadtest/broker.py hotpath): the "
                "relay's encode, route and frames (for two daemons when routed), and a daemon's BSON decode of "
                "its frames and Consumer.take, its connections one per user held, one frame per message",
        **machine.describe()}
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(orjson.dumps({k: result[k] for k in ("best", "two_daemons_summed_us_per_msg", "two_over_one_daemon_cpu",
                                               "relay_routed_over_whole")}, option=orjson.OPT_INDENT_2).decode())
    print(f"wrote {out}")


if __name__ == "__main__":
    app()
