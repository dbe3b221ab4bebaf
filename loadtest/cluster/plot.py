"""The cluster bench's PNG: rate and delivery latency per run, CPU per message
per stage, and each fault's rate of the spared traffic against its baseline."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STAGES = ("api", "writer", "relay", "daemon", "mysql", "ferretdb")


def plot(result: dict, path: Path) -> Path:
    runs, faults = result["runs"], result["faults"]
    labels = [f"{r['mode']}\nP={r['partitions']}" for r in runs]
    fig, axes = plt.subplots(1, 3 if faults else 2, figsize=(16 if faults else 11, 5))
    ax = axes[0]
    x = range(len(runs))
    ax.bar([i - 0.2 for i in x], [r["msgs_per_s"] for r in runs], 0.4, label="stored msgs/s")
    ax.set_ylabel("messages/s (offered: {})".format(result["traffic"]["offered_per_s"]))
    ax.set_xticks(list(x), labels)
    twin = ax.twinx()
    twin.plot(list(x), [r["delivery_p50_ms"] or 0 for r in runs], "o-", color="tab:green", label="delivery p50")
    twin.plot(list(x), [r["delivery_p99_ms"] or 0 for r in runs], "s--", color="tab:red", label="delivery p99")
    twin.set_ylabel("ms, POST sent to frame received")
    ax.set_title("rate and delivery latency")
    ax.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)

    ax = axes[1]
    bottom = [0.0] * len(runs)
    for stage in STAGES:
        values = [r["cpu_us_per_msg"].get(stage) or 0 for r in runs]
        ax.bar(list(x), values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("CPU µs per stored message (all hosts)")
    ax.set_title("CPU per message by stage")
    ax.legend(fontsize=8)

    if faults:
        ax = axes[2]
        fx = range(len(faults))
        ax.bar([i - 0.2 for i in fx], [f["baseline_msgs_per_s"] for f in faults], 0.4, label="before the fault")
        ax.bar([i + 0.2 for i in fx], [f["others_msgs_per_s"] for f in faults], 0.4, label="during it")
        ax.set_xticks(list(fx), [f"{f['name']}\nlost {f['lost']} dup {f['duplicated']}" for f in faults])
        ax.set_ylabel("stored msgs/s of the traffic the fault should spare")
        ax.set_title("faults")
        ax.legend(fontsize=8)
    fig.suptitle(f"{result['hosts']} hosts, +{result['rtt_ms']:g} ms host-database round trip (Toxiproxy); "
                 f"{result['traffic']['clients']} WebSocket clients; {result['where']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
