"""The cluster bench's global lock and P = 4 at several offered rates, rounds alternated.

How far P = 4's delivery p50 against the global lock's depends on how busy the box
is: ``python -m loadtest.cluster.load_sweep`` runs the bench
(``--partitions 4 --no-faults --grow-to 0``) at each ``--rates`` in turn, ``--rounds``
times, each run on a fresh cluster, and writes every run's whole result, a summary
per rate and a plot. Root, like the bench.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import typer

from loadtest.common.machine import describe
from loadtest.common.results import RESULTS, UNPUBLISHED
BENCH = ["-m", "loadtest.cluster.bench", "--partitions", "4", "--no-faults", "--grow-to", "0"]


def summarise(runs: list[dict]) -> list[dict]:
    """Per offered rate, from each bench result in ``runs``: its global-lock and P = 4 delivery
    p50s, their ratios run by run, and in each mode the stages' CPU per message and the cores
    they kept busy (medians)."""
    by_rate: dict[float, list[dict]] = {}
    for result in runs:
        by_rate.setdefault(result["traffic"]["offered_per_s"], []).append(result)
    rows = []
    for rate, results in sorted(by_rate.items()):
        pairs = [(mode_run(r, "global-lock"), mode_run(r, "partitioned")) for r in results]
        rows.append({
            "offered_per_s": rate,
            "global_lock_p50_ms": [g["delivery_p50_ms"] for g, _ in pairs],
            "p4_p50_ms": [p["delivery_p50_ms"] for _, p in pairs],
            "p4_over_global": [round(p["delivery_p50_ms"] / g["delivery_p50_ms"], 2) for g, p in pairs],
            "global_lock_cpu_ms_per_msg": round(statistics.median(_cpu_ms(g) for g, _ in pairs), 2),
            "p4_cpu_ms_per_msg": round(statistics.median(_cpu_ms(p) for _, p in pairs), 2),
            # the cores those processes kept busy: what is left of two for the rest, and for waits
            "global_lock_cores": round(statistics.median(_cpu_ms(g) * g["msgs_per_s"] for g, _ in pairs) / 1000, 2),
            "p4_cores": round(statistics.median(_cpu_ms(p) * p["msgs_per_s"] for _, p in pairs) / 1000, 2),
            "lost": sum(g["lost"] + p["lost"] for g, p in pairs),
            "duplicated": sum(g["duplicated"] + p["duplicated"] for g, p in pairs),
        })
    return rows


def mode_run(result: dict, mode: str) -> dict:
    """The run of ``mode`` (global-lock, partitioned) in one bench result."""
    (run,) = [r for r in result["runs"] if r["mode"] == mode]
    return run


def _cpu_ms(run: dict) -> float:
    """The stages' processes' CPU per stored message, all hosts, in ms (the load's own left out)."""
    return sum(v or 0 for v in run["cpu_us_per_msg"].values()) / 1000


def plot(summary: list[dict], path: Path, where: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for row in summary:
        rate = row["offered_per_s"]
        left.plot([rate] * len(row["global_lock_p50_ms"]), row["global_lock_p50_ms"], "o", color="tab:blue")
        left.plot([rate] * len(row["p4_p50_ms"]), row["p4_p50_ms"], "s", color="tab:orange")
        right.plot([rate] * len(row["p4_over_global"]), row["p4_over_global"], "D", color="tab:purple")
    rates = [row["offered_per_s"] for row in summary]
    left.plot(rates, [statistics.median(r["global_lock_p50_ms"]) for r in summary], "-", color="tab:blue",
              label="global lock (median)")
    left.plot(rates, [statistics.median(r["p4_p50_ms"]) for r in summary], "-", color="tab:orange",
              label="P = 4, writes led (median)")
    left.set_xlabel("messages/s offered")
    left.set_ylabel("delivery p50, ms (POST sent to frame received)")
    left.set_ylim(bottom=0)
    left.legend(fontsize=8)
    left.set_title("delivery p50 by offered rate, each run a point")
    right.axhline(1.0, color="grey", linestyle="--", label="the goal: P = 4 no slower")
    right.plot(rates, [statistics.median(r["p4_over_global"]) for r in summary], "-", color="tab:purple",
               label="median")
    right.set_xlabel("messages/s offered")
    right.set_ylabel("P = 4 p50 ÷ global-lock p50, same bench")
    right.set_ylim(bottom=0)
    right.legend(loc="upper left", fontsize=8)
    cores = right.twinx()
    cores.plot(rates, [r["global_lock_cores"] for r in summary], ":", color="tab:blue", label="global lock")
    cores.plot(rates, [r["p4_cores"] for r in summary], ":", color="tab:orange", label="P = 4")
    cores.set_ylabel("cores the stages kept busy, of 2 (dotted)")
    cores.set_ylim(0, 2)
    cores.legend(loc="lower right", fontsize=8)
    right.set_title("P = 4 against the global lock")
    fig.suptitle(textwrap.fill(f"3 hosts, +2 ms host-database round trip, 1,500 devices; {where}", 160), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(rates: str = typer.Option("25,50,100", help="messages/s offered, run in this order each round"),
         rounds: int = typer.Option(2, min=1),
         out: Path = typer.Option(RESULTS / "cluster-load.json")) -> None:
    UNPUBLISHED.mkdir(parents=True, exist_ok=True)
    runs = []
    for round_ in range(1, rounds + 1):
        for rate in [float(r) for r in rates.split(",")]:
            path = UNPUBLISHED / f"cluster-load-{rate:g}-{round_}.json"
            print(f"round {round_}, {rate:g} msg/s", flush=True)
            subprocess.run([sys.executable, *BENCH, "--rate", str(rate), "--out", str(path)], check=True)
            runs.append(json.loads(path.read_text()))
    summary = summarise(runs)
    for row in summary:
        print(f"{row['offered_per_s']:g} msg/s: global lock p50 {row['global_lock_p50_ms']} ms, P = 4 "
              f"{row['p4_p50_ms']} ms, P = 4 / global {row['p4_over_global']}; CPU per message "
              f"{row['global_lock_cpu_ms_per_msg']} / {row['p4_cpu_ms_per_msg']} ms, cores busy "
              f"{row['global_lock_cores']} / {row['p4_cores']}", flush=True)
    where = runs[0]["where"]
    out.write_text(json.dumps({
        "what": "the cluster bench's global lock and P = 4 (3 hosts, 2 ms RTT, 1,500 devices, 20 s) at each "
                "offered rate, rounds alternated, each run on a fresh cluster",
        "command": f"python -m loadtest.cluster.load_sweep --rates {rates} --rounds {rounds}",
        "machine": describe(), "where": where, "summary": summary, "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}\nwrote {plot(summary, out.with_suffix('.png'), where)}")


if __name__ == "__main__":
    typer.run(main)
