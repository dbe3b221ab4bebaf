"""The daemon's CPU per message, two revisions interleaved: one daemon fed by the
relay (``loadtest.peers``' setup: the relay's real code in a feed process, one
frame per message, the compiled Go client holding the connections), the same
schedule for each, round after round in alternating order.

    python -m loadtest.daemon_ab --base /tmp/base-checkout --rounds 2 --steps 10000x4,20000x4

``--base`` is another checkout of this repository (``git worktree add``) whose
daemon runs as "base"; "this" is the daemon of the checkout this runs from. The
feed, the relay and the clients are this checkout's for both. Per step: the
daemon's CPU µs per message (and its ratio, this / base, within the round),
p50/p99, lost and duplicated; and the daemon's PSS per idle connection. Runs
on FerretDB's stand-ins only: no database is on the measured path (the feed
commits nothing), MariaDB only starts the daemon.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import typer

from loadtest.clients import loadclient
from loadtest.common import machine
from loadtest.common.results import UNPUBLISHED
from loadtest.peers.scenario import recorded_entries, run_ours


def _step_figures(result: dict) -> list[dict]:
    return [{"rate": f["rate"], "offered_per_s": f.get("offered_per_s"), "messages": f["messages"],
             "daemon_cpu_us_per_msg": (f.get("cpu_us_per_msg") or {}).get("server"),
             "p50_ms": f.get("p50_ms"), "p99_ms": f.get("p99_ms"), "lost": f["lost"]} for f in result["steps"]]


def main(base: Path = typer.Option(..., help="the other checkout, whose daemon runs as 'base'"),
         rounds: int = typer.Option(2), clients: int = typer.Option(10_000),
         steps: str = typer.Option("10000x4,20000x4"), gap: float = typer.Option(3.0),
         out: Path = typer.Option(UNPUBLISHED / "daemon-ab.json")) -> None:
    from harness.system import databases
    from harness.servers import ROOT

    loadclient.install()
    tmp = Path(tempfile.mkdtemp(prefix="daemon-ab-"))
    sides = {"base": base.resolve(), "this": ROOT}
    runs: list[dict] = []
    with databases(tmp / "dbs") as dbs:
        entries_file = recorded_entries(dbs, tmp)
        for r in range(rounds):
            order = ["base", "this"] if r % 2 == 0 else ["this", "base"]
            one: dict[str, Any] = {}
            for side in order:
                print(f"[daemon_ab {time.strftime('%H:%M:%S')}] round {r + 1}/{rounds}: {side}", flush=True)
                result = run_ours(dbs, entries_file, clients, 1, steps, gap, tmp, False, 1, "go",
                                  daemon_root=sides[side])
                one[side] = {"kb_per_conn": result["kb_per_conn"], "lost": result["lost"],
                             "duplicated": result["duplicated"], "steps": _step_figures(result)}
                print(orjson.dumps({side: one[side]}).decode(), flush=True)
            one["ratio_this_over_base"] = [
                round(t["daemon_cpu_us_per_msg"] / b["daemon_cpu_us_per_msg"], 3)
                if t["daemon_cpu_us_per_msg"] and b["daemon_cpu_us_per_msg"] else None
                for b, t in zip(one["base"]["steps"], one["this"]["steps"], strict=True)]
            runs.append(one)
    rates = [s["rate"] for s in runs[0]["base"]["steps"]]
    summary = {f"{int(rate)}": {
        "ratio_median": statistics.median(r["ratio_this_over_base"][i] for r in runs
                                          if r["ratio_this_over_base"][i] is not None),
        "base_us": [r["base"]["steps"][i]["daemon_cpu_us_per_msg"] for r in runs],
        "this_us": [r["this"]["steps"][i]["daemon_cpu_us_per_msg"] for r in runs]} for i, rate in enumerate(rates)}
    result = {"what": "one daemon's CPU per message fed by the relay, two revisions interleaved "
                      "(loadtest/daemon_ab.py)",
              "base": str(sides["base"]), "clients": clients, "steps": steps, "client": "go", "by_rate": summary,
              "kb_per_conn": {"base": [r["base"]["kb_per_conn"] for r in runs],
                              "this": [r["this"]["kb_per_conn"] for r in runs]},
              "lost": sum(r[s]["lost"] for r in runs for s in ("base", "this")),
              "duplicated": sum(r[s]["duplicated"] for r in runs for s in ("base", "this")),
              "rounds": runs, **machine.describe()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print(orjson.dumps({"by_rate": summary, "kb_per_conn": result["kb_per_conn"], "lost": result["lost"],
                        "duplicated": result["duplicated"]}, option=orjson.OPT_INDENT_2).decode())
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
