"""The peers run (``loadtest.peers``) as tables for docs/benchmarks.md and one plot:
latency p99 against the offered rate, ours and Centrifugo's, round by round."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SIDES = (("ours", "ours"), ("centrifugo", "Centrifugo 5.4.9"))


def _v(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _r(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×"


def steps_table(run: dict) -> list[str]:
    # Runs that name their load client also show its CPU per frame beside the server's
    # (results from before it was measured keep their table as published).
    clients = "client" in run
    lines = ["| msg/s offered | frames | lost | duplicated over the run | p50 / p99 ms | server µs per msg | "
             "feed µs per msg |" + (" server / clients µs per frame |" if clients else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if clients else "")]
    for step in run["steps"]:
        cpu = step.get("cpu_us_per_msg") or {}
        line = (f"| {_v(step.get('offered_per_s'))} (asked {_v(step['rate'])}) | {_v(step['frames'])} | "
                f"{_v(step['lost'])} | {_v(run['duplicated'])} | {_v(step['p50_ms'])} / {_v(step['p99_ms'])} | "
                f"{_v(cpu.get('server'))} | {_v(cpu.get('feed'))} |")
        if clients:
            frame = step.get("cpu_us_per_frame") or {}
            line += (f" {_v(frame.get('server'))} / {_v(frame.get('clients'))}"
                     f"{' (client-bound)' if step.get('client_bound') else ''} |")
        lines.append(line)
    return lines


def client_rows(data: dict) -> list[str]:
    """The load client's CPU per frame beside each server's, for runs that measured it."""
    if not data.get("client"):
        return []

    def bound(key: str) -> str:
        return " (client-bound)" if data.get(key) else ""

    return [f"| load clients' CPU per frame at that rate ({data['client']}), µs; server's | "
            f"{_v(data.get('ours_client_cpu_us_per_frame'))}; {_v(data.get('ours_server_cpu_us_per_frame'))}"
            f"{bound('ours_client_bound')} | {_v(data.get('peer_client_cpu_us_per_frame'))}; "
            f"{_v(data.get('peer_server_cpu_us_per_frame'))}{bound('peer_client_bound')} | |"]


def peers_tables(results: Path) -> list[str]:
    path = results / "peers-latest.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    ours = data["rounds"][0]["ours"] if data.get("rounds") else {}
    daemons = ours.get("daemons", 1)
    shape = (f"Ours ran as **{daemons} daemon processes on one port, the relay routing by user**; "
             if ours.get("routed_by_user") else f"Ours ran as {daemons} daemon process{'es' if daemons > 1 else ''}; ")
    lines = ["## Beside Centrifugo 5.4.9 (`python -m loadtest.peers`, `make bench-full`)", "",
             f"{data['date']}, commit {data['commit']}. Where: {data['where']}", "",
             shape + "Centrifugo as one process, which uses both cores.", "",
             "| | ours | Centrifugo | ours / theirs |", "|---|---|---|---|",
             f"| server memory per idle connection, KB ({data['clients']:,} connections) | "
             f"{_v(data['ours_kb_per_conn'])} | {_v(data['peer_kb_per_conn'])} | {_r(data['memory_ratio'])} |",
             f"| highest one-to-one rate with p99 < 100 ms and nothing lost, msg/s | "
             f"{_v(data['ours_max_rate_p99_100ms'])} | {_v(data['peer_max_rate_p99_100ms'])} | "
             f"{_r(data['rate_ratio'])} |",
             f"| server CPU per message at that rate, µs | {_v(data['ours_cpu_us_per_msg'])} | "
             f"{_v(data['peer_cpu_us_per_msg'])} | {_r(data['cpu_ratio'])} |",
             f"| its feed's CPU per message, µs | {_v(data['ours_feed_cpu_us_per_msg'])} | "
             f"{_v(data['peer_feed_cpu_us_per_msg'])} | |", *client_rows(data), "",
             "Medians over the rounds. Round by round, each step of the schedule:", ""]
    for i, one in enumerate(data["rounds"], 1):
        for side, label in SIDES:
            run = one[side]
            lines += [f"**Round {i}, {label}**: {_v(run['kb_per_conn'])} KB per connection, sustained "
                      f"{_v(run['max_rate_p99_100ms'])} msg/s, knee {_v(run['knee_rate'])}.", "", *steps_table(run), ""]
    overload = data.get("overload") or {}
    if overload:
        lines += [f"**Overload**, {data['overload_devices_per_user']} devices per user (each message is that many "
                  "frames), ours with every batch committed to MariaDB before the relay has it:", ""]
        for side, label in SIDES:
            run = overload[side]
            lines += [f"*{label}*: knee {_v(run['knee_rate'])} msg/s; reconnects {_v(run['reconnects'])} "
                      f"(close codes {run['close_codes'] or 'none'}).", "", *steps_table(run), ""]
        lines += [f"Past the knee ours lost **{_v(data['ours_lost_past_knee'])}** frames; Centrifugo lost "
                  f"{_v(data['peer_lost_past_knee'])}.", ""]
    return lines + ["![p99 against the rate](../loadtest/results/peers-latest.png)", ""]


def plot(data: dict, path: Path) -> None:
    panels = [("one frame per message", list(data["rounds"]))]
    if data.get("overload"):
        panels.append((f"{data['overload_devices_per_user']} frames per message (overload)", [data["overload"]]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (title, runs) in zip(axes[0], panels, strict=True):
        for one in runs:
            for side, label in SIDES:
                steps = [s for s in one[side]["steps"] if s["p99_ms"] is not None]
                ax.plot([s["rate"] for s in steps], [s["p99_ms"] for s in steps], marker="o",
                        color="tab:blue" if side == "ours" else "tab:orange", alpha=0.8, label=label)
                lost = [s for s in steps if s["lost"]]
                ax.scatter([s["rate"] for s in lost], [s["p99_ms"] for s in lost], marker="x", color="red", zorder=3)
        ax.axhline(100, color="grey", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("messages/s offered")
        ax.set_ylabel("delivery p99, ms (x: a step that lost frames)")
        ax.set_title(title)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        ax.legend(unique.values(), unique.keys())
    fig.suptitle(f"Ours beside Centrifugo 5.4.9, {data['clients']:,} connections, 2 shared cores "
                 f"({data['commit']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
