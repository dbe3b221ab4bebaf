"""The idle run (``loadtest.idle``) as a section of docs/benchmarks.md: the cores each
process keeps busy while nothing happens, and the first message after a quiet spell
beside the same run's steady traffic."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.report.provenance import scenario_provenance

RESULT_FILE = "idle-latest.json"


def _v(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _pair(figures: dict) -> str:
    return f"{_v(figures['p50'])}/{_v(figures['p99'])}"


def idle_table(r: dict) -> list[str]:
    """The section: provenance, one row per process, the latencies and the goal."""
    p, goal = r["parameters"], r["goal"]
    lines = [
        "## An idle stack (`python -m loadtest.idle`)", "",
        scenario_provenance(r, also="the pusher (idle: no gateway)"), "",
        f"One WebSocket client connected, nothing sent for {p['idle_seconds']:g} s, then {p['sample_seconds']:g} s"
        " of each process's CPU time (/proc, with its children) sampled: the cores it keeps busy doing nothing."
        " Then one message posted (delivery = POST sent → frame on the socket), the first after that quiet,"
        f" and {p['rounds']} more each after {p['gap_seconds']:g} s of quiet; then {p['rate']:g} msg/s for"
        f" {p['traffic_seconds']:g} s, each timed alike, in the same run.", "",
        "| process | cores while idle |", "|---|---|"]
    for name, cores in r["idle_cores"].items():
        lines.append(f"| {name} | {_v(cores)} |")
    met = "met" if goal["cores_met"] else "**not met**"
    lines.append(f"| **all** | **{_v(r['idle_cores_total'])}** (goal < {_v(goal['cores'])}: {met}) |")
    after, traffic = r["after_idle"], r["traffic"]
    met = "met" if goal["latency_met"] else "**not met**"
    lines += ["", "| delivery | messages | p50/p99 ms | max ms |", "|---|---|---|---|",
              f"| first after the quiet of {p['idle_seconds']:g} s | 1 | {_v(r['first_after_idle_minute_ms'])} | – |",
              f"| after quiet (that one and the {p['rounds']} after {p['gap_seconds']:g} s each) | {after['n']} |"
              f" {_pair(after)} | {_v(after['max'])} |",
              f"| under {p['rate']:g} msg/s | {traffic['n']} | {_pair(traffic)} | {_v(traffic['max'])} |", "",
              f"After quiet minus under traffic, medians: {_v(r['after_idle_minus_traffic_p50_ms'])} ms (goal ≤"
              f" {_v(goal['latency_ms'])} ms: {met}). Host CPU during the sample: busy"
              f" {_v(r['host_cpu_during_sample']['busy_pct'])} %, stolen {_v(r['host_cpu_during_sample']['steal_pct'])}"
              f" %. {_v(r['lost'])} messages lost." + (f" **FAILED: {r['failed']}**" if r.get("failed") else ""), ""]
    return lines


def idle_tables(results: Path) -> list[str]:
    path = results / RESULT_FILE
    return idle_table(json.loads(path.read_text())) if path.exists() else []
