"""Interleaved A/B of git revisions on the write path (`ab`) and on the daemon tier (`replay`).

    .venv/bin/python -m loadtest.common.compare_tiers 7119f59 HEAD --name write-path-and-daemon --rounds 3

As ``loadtest.common.compare`` does for delivery: every revision is checked out into
a worktree of its own and its own code runs each scenario, alternately with
the others, on fresh databases.
- ``ab``: `ab -k -c 100` on POST /v1/messages for ``seconds``, the system as
  that revision's supervisord.conf deploys it (MySQL and FerretDB in the path).
- ``replay``: recorded oplog entries fed as fast as they go into one real
  daemon holding ``clients`` WebSocket clients, every frame checked.
Prints each run and the medians; writes loadtest/results/compare-tiers-<name>.json.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
from pathlib import Path

import orjson
import typer

from loadtest.common import machine
from harness.servers import ROOT
from loadtest.common.compare import worktree
from loadtest.common.results import RESULTS

AB_RUN = """
import sys, tempfile, orjson
from pathlib import Path
from loadtest.bench import AS_DEPLOYED, DEPLOYED_DAEMONS, ab, post_body
from harness.system import databases, running_system
seconds = float(sys.argv[1])
env = {"CHAT_RATE_LIMIT_PER_SECOND": 0, "CHAT_LOG_LEVEL": "WARNING", "CHAT_WRITER_QUEUE_MAX": 50_000}
with databases(Path(tempfile.mkdtemp(prefix="compare-ab-"))) as dbs:
    with running_system(dbs, daemons=DEPLOYED_DAEMONS, **AS_DEPLOYED, **env) as system:
        result = ab.run(f"{system.api_url}/v1/messages", 100, seconds, system.token("ab-sender"), post_body())
print("RESULT " + orjson.dumps(result).decode(), flush=True)
"""

REPLAY_RUN = """
import sys, orjson
from loadtest import replay
clients, count = int(sys.argv[1]), int(sys.argv[2])
result = replay.bench(clients, 0, count, 1, replay.tick_batch(0), progress=False)
print("RESULT " + orjson.dumps(result).decode(), flush=True)
"""

# scenario -> (the figures compared, where a higher value is better)
FIGURES = {"ab": (("rps", True), ("p50_ms", False), ("p99_ms", False), ("errors", False)),
           "replay": (("messages_per_s", True), ("daemon_cpu_us_per_message", False), ("lost", False),
                      ("duplicates", False))}

app = typer.Typer(add_completion=False)


def run_one(tree: Path, code: str, *args: object) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, stdout=subprocess.PIPE, text=True,
                          timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"run in {tree} failed with {proc.returncode}")
    return orjson.loads(lines[-1][len("RESULT "):])


def figures(scenario: str, run: dict) -> dict:
    return {key: run.get(key) for key, _ in FIGURES[scenario]}


@app.command()
def main(revisions: list[str] = typer.Argument(..., help="two or more git revisions, run alternately"),
         name: str = typer.Option(..., help="what the revisions differ in, for the file name"),
         seconds: float = typer.Option(15.0, help="ab's run"),
         clients: int = typer.Option(10_000, help="replay's clients"),
         count: int = typer.Option(300_000, help="replay's messages"),
         rounds: int = typer.Option(3, min=1, max=20)) -> None:
    resolved = [subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                               capture_output=True, text=True).stdout.strip() for rev in revisions]
    runs: dict[str, dict[str, list[dict]]] = {s: {rev: [] for rev in resolved} for s in FIGURES}
    with contextlib.ExitStack() as stack:
        trees = {rev: stack.enter_context(worktree(rev)) for rev in resolved}
        for round_no in range(1, rounds + 1):
            for scenario in FIGURES:
                for rev in resolved:
                    print(f"[compare] round {round_no}/{rounds}: {scenario} {rev}", flush=True)
                    if scenario == "ab":
                        run = run_one(trees[rev], AB_RUN, seconds)
                    else:
                        run = run_one(trees[rev], REPLAY_RUN, clients, count)
                    runs[scenario][rev].append(figures(scenario, run))
                    print(f"[compare]   {runs[scenario][rev][-1]}", flush=True)
    medians = {scenario: {rev: {key: statistics.median(r[key] for r in rs) for key, _ in FIGURES[scenario]}
                          for rev, rs in by_rev.items()} for scenario, by_rev in runs.items()}
    base = resolved[0]
    print(f"\nmedians of {rounds} runs each; ratio to {base}:")
    for scenario, by_rev in medians.items():
        for rev, m in by_rev.items():
            ratios = ", ".join(f"{key} {m[key]} ({m[key] / by_rev[base][key]:.2f}x)" if by_rev[base][key] else
                               f"{key} {m[key]}" for key, _ in FIGURES[scenario])
            print(f"  {scenario} {rev}: {ratios}")
    out = RESULTS / f"compare-tiers-{name}.json"
    out.write_bytes(orjson.dumps({"machine": machine.describe(), "rounds": rounds, "ab_seconds": seconds,
                                  "replay_clients": clients, "replay_messages": count,
                                  "order": "alternating, fresh databases", "runs": runs, "medians": medians},
                                 option=orjson.OPT_INDENT_2))
    print(f"wrote {out}")
    bad = [rev for rev, rs in runs["replay"].items() for r in rs if r["lost"] or r["duplicates"]]
    bad += [rev for rev, rs in runs["ab"].items() for r in rs if r["errors"]]
    if bad:
        raise SystemExit(f"FAILED: lost, duplicated or refused in runs of {', '.join(sorted(set(bad)))}")


if __name__ == "__main__":
    app()
