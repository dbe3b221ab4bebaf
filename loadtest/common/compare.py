"""Interleaved A/B of git revisions on the whole system, each as it deploys.

    .venv/bin/python -m loadtest.common.compare 6a724aa HEAD --name insert-pump --clients 10000 --rate 1000 --rounds 6

On this shared two-core machine one run's figures move by tens of percent
from one minute to the next, so a change is judged only against another
revision run alternately with it, each run on fresh databases. Every
revision is checked out into a git worktree of its own, and its own code
runs the `ws` scenario of ``loadtest.bench`` (as that revision's
supervisord.conf deploys it), so both sides are measured the same way.
Prints one line per run and the medians; writes
loadtest/results/compare-<name>-<clients>c-<rate>.json: the name says what
is compared, the file holds the revisions.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import typer

from harness.servers import ROOT
from loadtest.common import machine  # this checkout's: the machine is described, not the revision
from loadtest.common.results import RESULTS

# Runs inside the revision's worktree, on its own code (an older revision has
# no copy of this module of its own).
ONE_RUN = """
import sys, tempfile, orjson
from pathlib import Path
from loadtest.bench import AS_DEPLOYED, DEPLOYED_DAEMONS, ws_runs
from harness.system import databases, running_system
clients, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
env = {"CHAT_RATE_LIMIT_PER_SECOND": 0, "CHAT_LOG_LEVEL": "WARNING", "CHAT_WRITER_QUEUE_MAX": 50_000}
with databases(Path(tempfile.mkdtemp(prefix="compare-"))) as dbs:
    with running_system(dbs, daemons=DEPLOYED_DAEMONS, **AS_DEPLOYED, **env) as system:
        result = ws_runs(system, [clients], rate, seconds)[0]
print("RESULT " + orjson.dumps(result).decode(), flush=True)
"""

# (label, key in a ws result): the p50 and p99 of each, in ms
FIGURES = (("delivery", "e2e_ms"), ("FerretDB tail", "ferretdb_tail_ms"), ("creation", "creation_ms"),
           ("stored → in FerretDB", "mongo_lag_ms"), ("fan-out", "fanout_ms"))

app = typer.Typer(add_completion=False)


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"compare-{rev}-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        (path / ".cache").mkdir(exist_ok=True)
        (path / ".cache" / "ferretdb").symlink_to(ROOT / ".cache" / "ferretdb")  # built once, by bootstrap
        yield path
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], check=False)


def run_one(tree: Path, clients: int, rate: float, seconds: float) -> dict:
    # The revision's code first on the path (the venv's editable install points at this checkout).
    proc = subprocess.run([sys.executable, "-c", ONE_RUN, str(clients), str(rate), str(seconds)], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE, text=True,
                          timeout=seconds + 600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"run in {tree} failed with {proc.returncode}")
    return orjson.loads(lines[-1][len("RESULT "):])


def gap(run: dict, q: str) -> float | None:
    e, t = run["e2e_ms"].get(q), (run.get("ferretdb_tail_ms") or {}).get(q)
    return None if e is None or t is None else round(e - t, 1)


def line(rev: str, run: dict) -> str:
    parts = [f"{label} {_pair(run.get(key))}" for label, key in FIGURES]
    return (f"{rev}: " + ", ".join(parts) + f", gap {gap(run, 'p50')}/{gap(run, 'p99')}"
            f", lost {run['lost']}, dup {run['duplicates']}")


def _pair(figure: dict | None) -> str:
    return "–" if not figure else f"{figure.get('p50')}/{figure.get('p99')}"


def medians(runs: list[dict]) -> dict:
    out = {}
    for _label, key in FIGURES:
        for q in ("p50", "p99"):
            values = [r[key][q] for r in runs if r.get(key) and r[key].get(q) is not None]
            out[f"{key}.{q}"] = round(statistics.median(values), 1) if values else None
    for q in ("p50", "p99"):
        values = [g for r in runs if (g := gap(r, q)) is not None]
        out[f"gap.{q}"] = round(statistics.median(values), 1) if values else None
    return out


@app.command()
def main(revisions: list[str] = typer.Argument(..., help="two or more git revisions, run alternately"),
         name: str = typer.Option(..., help="what the revisions differ in, for the file name (insert-pump)"),
         clients: int = typer.Option(10_000), rate: float = typer.Option(1000.0),
         seconds: float = typer.Option(20.0), rounds: int = typer.Option(3, min=1, max=20)) -> None:
    resolved = [subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                               capture_output=True, text=True).stdout.strip() for rev in revisions]
    runs: dict[str, list[dict]] = {rev: [] for rev in resolved}
    with contextlib.ExitStack() as stack:
        trees = {rev: stack.enter_context(worktree(rev)) for rev in resolved}
        for round_no in range(1, rounds + 1):
            for rev in resolved:
                print(f"[compare] round {round_no}/{rounds}: {rev}", flush=True)
                run = run_one(trees[rev], clients, rate, seconds)
                runs[rev].append(run)
                print(f"[compare]   {line(rev, run)}", flush=True)
    summary = {rev: medians(rs) for rev, rs in runs.items()}
    print(f"\nmedians of {rounds} runs each ({clients:,} clients, {rate:g} msg/s, {seconds:g} s; ms):")
    for rev, m in summary.items():
        print(f"  {rev}: delivery p50 {m['e2e_ms.p50']}, p99 {m['e2e_ms.p99']}; gap p50 {m['gap.p50']}, "
              f"p99 {m['gap.p99']}; creation p50 {m['creation_ms.p50']}; stored → in FerretDB p50 "
              f"{m['mongo_lag_ms.p50']}")
    out = RESULTS / f"compare-{name}-{clients}c-{rate:g}.json"
    out.write_bytes(orjson.dumps({"machine": machine.describe(), "clients": clients, "rate": rate,
                                  "seconds": seconds, "rounds": rounds, "order": "alternating, fresh databases",
                                  "runs": runs, "medians": summary}, option=orjson.OPT_INDENT_2))
    print(f"wrote {out}")
    failed = [rev for rev, rs in runs.items() for r in rs if r["lost"] or r["duplicates"]]
    if failed:
        raise SystemExit(f"FAILED: messages lost or duplicated in runs of {', '.join(sorted(set(failed)))}")


if __name__ == "__main__":
    app()
