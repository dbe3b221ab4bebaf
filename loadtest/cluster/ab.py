"""The cluster bench's global lock and P = 4, two checkouts alternated round by round.

    python -m loadtest.cluster.ab --base /tmp/base-checkout --rounds 3 --name commit-trip \\
        --what "a batch as one query against a round trip per statement"

``--base`` is another checkout of this repository (``git worktree add``, its
``.venv`` and ``.cache`` may be links to this one's): its own code runs the
bench as "before", this checkout's as "after". Each round runs "after", then
"before", each ``python -m loadtest.cluster.bench --partitions 4 --no-faults
--grow-to 0`` (plus ``--set``) on a fresh cluster. On this shared two-core box
one run's figures move by tens of percent from one minute to the next, so only
the two runs of one round compare. Writes every run's whole result, a summary
row per run (the figures the decision records cite) and a plot of them round
by round into ``loadtest/results/cluster-<name>.json`` and ``.png``. Root,
like the bench.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import typer

from loadtest.cluster.load_sweep import BENCH, mode_run
from loadtest.common.machine import describe
from loadtest.common.results import RESULTS, UNPUBLISHED

SIDES = ("after", "before")


def summary_row(side: str, round_: int, result: dict) -> dict:
    """One bench run's figures beside its side and round: delivery and POST p50 in both modes,
    P = 4 against the global lock, the commits, the copies, and the CPU per message of the
    writer, MySQL and Toxiproxy at P = 4."""
    glob, p4 = mode_run(result, "global-lock"), mode_run(result, "partitioned")
    by_path = p4.get("delivery_ms_by_path") or {}
    copy, sender = (by_path.get("recipient_other_partition") or {}).get("p50"), (by_path.get("sender") or {}).get("p50")
    return {
        "side": side, "round": round_,
        "global_lock_p50_ms": glob["delivery_p50_ms"], "p4_p50_ms": p4["delivery_p50_ms"],
        "p4_over_global": round(p4["delivery_p50_ms"] / glob["delivery_p50_ms"], 2),
        "global_post_p50_ms": glob["post_ms"]["p50"], "p4_post_p50_ms": p4["post_ms"]["p50"],
        "global_commit_ms": glob["writers"]["commit_ms"], "p4_commit_ms": p4["writers"]["commit_ms"],
        "p4_copy_lag_ms": p4["writers"].get("copy_lag_ms"),
        "p4_copy_minus_sender_ms": None if copy is None or sender is None else round(copy - sender, 1),
        "p4_mongo_insert_ms": p4["writers"].get("mongo_insert_ms"),
        "p4_writer_cpu_us_per_msg": p4["cpu_us_per_msg"]["writer"],
        "p4_mysql_cpu_us_per_msg": p4["cpu_us_per_msg"]["mysql"],
        "p4_toxiproxy_cpu_us_per_msg": p4["cpu_us_per_msg"].get("toxiproxy"),
        "lost": sum(r["lost"] for r in result["runs"]), "duplicated": sum(r["duplicated"] for r in result["runs"]),
    }


# What the plot shows, one panel each: (summary field, axis label).
PANELS = (("p4_p50_ms", "P = 4 delivery p50, ms"), ("global_lock_p50_ms", "global lock delivery p50, ms"),
          ("p4_over_global", "P = 4 ÷ global lock"), ("p4_post_p50_ms", "P = 4 POST answered p50, ms"))


def plot(summary: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(14, 3.8))
    for ax, (field, label) in zip(axes, PANELS, strict=True):
        for side, marker, colour in (("after", "o", "tab:orange"), ("before", "s", "tab:blue")):
            rows = [r for r in summary if r["side"] == side]
            ax.plot([r["round"] for r in rows], [r[field] for r in rows], marker, color=colour, label=side)
        if field == "p4_over_global":
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel("round (the two runs of a round compare)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.set_xticks(sorted({r["round"] for r in summary}))
        ax.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 170), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(base: Path = typer.Option(..., help="the other checkout, whose code runs as 'before'"),
         name: str = typer.Option(..., help="what the two differ in, for the file name"),
         what: str = typer.Option(..., help="one line: what 'after' and 'before' are"),
         rounds: int = typer.Option(3, min=1),
         sets: list[str] = typer.Option([], "--set", help="NAME=VALUE for both sides' bench (its --set)")) -> None:
    UNPUBLISHED.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parents[2]
    extra = [arg for s in sets for arg in ("--set", s)]
    runs, summary = [], []
    for round_ in range(1, rounds + 1):
        for side in SIDES:
            checkout = here if side == "after" else base.resolve()
            out = UNPUBLISHED / f"cluster-ab-{name}-{side}-{round_}.json"
            print(f"round {round_}: {side} ({checkout})", flush=True)
            subprocess.run([str(checkout / ".venv/bin/python"), *BENCH, *extra, "--out", str(out)], cwd=checkout,
                           check=True)
            result = json.loads(out.read_text())
            row = summary_row(side, round_, result)
            print(f"  P = 4 {row['p4_p50_ms']} ms, global lock {row['global_lock_p50_ms']} ms "
                  f"({row['p4_over_global']}), POST at P = 4 {row['p4_post_p50_ms']} ms, "
                  f"lost {row['lost']}, duplicated {row['duplicated']}", flush=True)
            runs.append({"side": side, "round": round_, "result": result})
            summary.append(row)
    target = RESULTS / f"cluster-{name}.json"
    commits = {side: next(r["result"]["commit"] for r in runs if r["side"] == side) for side in SIDES}
    target.write_text(json.dumps({
        "what": f"the cluster bench's global lock and P = 4, {rounds} rounds alternated: {what}",
        "command": f"python -m loadtest.cluster.ab --base <checkout of {commits['before']}> --rounds {rounds} "
                   f"--name {name}" + "".join(f" --set {s}" for s in sets),
        "commit": commits, "machine": describe(), "summary": summary, "runs": runs}, indent=1) + "\n")
    title = f"{what}; {runs[0]['result']['where']}"
    print(f"wrote {target}\nwrote {plot(summary, target.with_suffix('.png'), title)}")


if __name__ == "__main__":
    typer.run(main)
