"""Cores past two, from the cluster bench's measured CPU per message:
`python -m loadtest.cluster.capacity [--rate R --partitions P]`.

Input: loadtest/results/cluster-latest.json (`make bench-cluster`). Each stage's
CPU µs per message, measured on 3 hosts in network namespaces, is projected
linearly to a target rate. Two facts decide how it spreads: a partition's
writer and stream are one process's work each (so a stage's share per
partition is 1 / P of it), and a daemon decodes only the partitions it
serves (its measured decoded share). FerretDB's figure is a stand-in's, not
MongoDB's: it is shown, and left out of the total that ours decide.
"""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import typer
from loadtest.common.results import RESULTS

LATEST = RESULTS / "cluster-latest.json"
OURS = ("api", "writer", "relay", "daemon")
app = typer.Typer(add_completion=False)


def pick_run(result: dict, partitions: int | None = None) -> dict:
    """The partitioned run with ``partitions`` (default: the most partitions measured)."""
    runs = [r for r in result["runs"] if r["mode"] == "partitioned"]
    if partitions is not None:
        runs = [r for r in runs if r["partitions"] == partitions]
    if not runs:
        raise ValueError("no partitioned run with those partitions in the cluster results")
    return max(runs, key=lambda r: r["partitions"])


def project(run: dict, rate: float, partitions: int, core_busy: float = 0.7) -> list[tuple[str, str, str]]:
    """Rows (stage, cores at ``rate`` msg/s, how), with each core kept ``core_busy`` at most."""
    rows = []
    ours = 0.0
    for stage, us in sorted(run["cpu_us_per_msg"].items()):
        cores = us * rate / 1e6 / core_busy
        if stage in OURS:
            ours += cores
        rows.append((stage, f"{cores:,.1f}", f"{us:,.0f} µs/msg × {rate:,.0f} msg/s ÷ {core_busy:.0%} busy"))
    per_partition = run["cpu_us_per_msg"].get("writer", 0.0) * rate / partitions / 1e6 / core_busy
    rows.append(("writer, per partition", f"{per_partition:,.2f}",
                 f"the writer's share split over {partitions} partitions (each its own lock and sequence)"))
    shares = run.get("daemon_decoded_share") or []
    if shares and all(s is not None for s in shares):
        mean = sum(shares) / len(shares)
        rows.append(("daemon decodes", f"{mean:.0%} of the stream",
                     f"mean decoded share at P = {run['partitions']} (each daemon its partitions only)"))
    rows.append(("ours in total", f"{ours:,.1f}", "api + writer + relay + daemon; databases apart"))
    rows.append(("hosts of 8 cores for ours", f"{math.ceil(ours / 8)}", "ours in total ÷ 8"))
    return rows


def table(rows: list[tuple[str, str, str]]) -> str:
    return "| stage | cores | how |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)


@app.command()
def main(rate: float = 10_000, partitions: int = 16, measured_partitions: int | None = None,
         results: Path = LATEST) -> None:
    result = orjson.loads(results.read_bytes())
    run = pick_run(result, measured_partitions)
    print(f"From {results.name} ({result.get('where', '')}, commit {result.get('commit', '?')}), "
          f"the run at P = {run['partitions']}; projected to {rate:,.0f} msg/s over {partitions} partitions:")
    print(table(project(run, rate, partitions)))


if __name__ == "__main__":
    app()
