"""A capacity model past one machine, from measured figures: rerun it with
`python -m loadtest.capacity [--users N --rate R ...]`.

Inputs default to the latest benchmark (loadtest/results/latest.json) and the
limits of this machine; every output line says how it was computed.
"""

from __future__ import annotations

import math

import orjson
import typer

from loadtest.common.results import RESULTS

LATEST = RESULTS / "latest.json"
app = typer.Typer(add_completion=False)


def measured() -> dict:
    data = orjson.loads(LATEST.read_bytes()) if LATEST.exists() else {}
    ws = data.get("ws", [])
    biggest = data.get("hold") or (max(ws, key=lambda w: w["clients"]) if ws else {})
    return {
        "kb_per_conn": biggest.get("daemon_rss_kb_per_conn", 2.0),
        "delivered_per_s": max((w["delivered_per_s"] for w in ws), default=1000.0),
        "post_rps": max((r["rps"] for r in data.get("ab", {}).get("post", [])), default=1000.0),
    }


@app.command()
def main(users_online: int = 1_000_000, messages_per_s: float = 5_000, devices_per_user: float = 1.5,
         conns_per_process: int = 15_000, processes_per_host: int = 6, host_ram_gib: float = 24,
         daemon_push_per_s: float = typer.Option(None, help="per process; default: measured"),
         oplog_entry_bytes: int = 600, tailers_per_partition: int = 1) -> None:
    m = measured()
    conns = users_online * devices_per_user
    push = daemon_push_per_s or m["delivered_per_s"]
    procs_for_conns = math.ceil(conns / conns_per_process)
    # each message is pushed to the recipient's and the sender's devices
    pushes = messages_per_s * 2 * devices_per_user
    procs_for_push = math.ceil(pushes / push)
    procs = max(procs_for_conns, procs_for_push)
    hosts = math.ceil(procs / processes_per_host)
    ram_per_host = processes_per_host * conns_per_process * m["kb_per_conn"] / 2**20
    # Every tailing process reads every oplog entry: read load = tailers x write rate.
    oplog_read_unpartitioned = procs * messages_per_s * oplog_entry_bytes
    partitions = hosts  # one daemon group (host) per user-id hash partition
    oplog_read_partitioned = partitions * tailers_per_partition * messages_per_s * oplog_entry_bytes
    lines = [
        f"| connections | {conns:,.0f} | users online x devices |",
        f"| daemon processes for connections | {procs_for_conns} | connections / {conns_per_process:,} per process |",
        f"| daemon processes for pushes | {procs_for_push} | {pushes:,.0f} pushes/s / {push:,.0f} measured "
        "per process |",
        f"| daemon processes | {procs} | the larger of the two |",
        f"| daemon hosts | {hosts} | {processes_per_host} processes per host |",
        f"| daemon RAM per host | {ram_per_host:.1f} GiB | {m['kb_per_conn']} KB/conn measured x "
        f"{conns_per_process:,} x {processes_per_host} (host has {host_ram_gib} GiB) |",
        f"| oplog read, every process tails | {oplog_read_unpartitioned / 2**20:,.0f} MiB/s | {procs} tailers x "
        f"{messages_per_s:,.0f} entries/s x {oplog_entry_bytes} B |",
        f"| oplog read, one tailer per partition | {oplog_read_partitioned / 2**20:,.0f} MiB/s | {partitions} "
        f"partitions x {tailers_per_partition} |",
        f"| write API processes | {math.ceil(messages_per_s / m['post_rps'])} | {messages_per_s:,.0f} msg/s / "
        f"{m['post_rps']:,.0f} measured POST/s (through FerretDB here) |",
        f"| MySQL rows per day | {messages_per_s * 86400:,.0f} | "
        f"~{messages_per_s * 86400 * 400 / 2**30:,.0f} GiB/day at ~400 B/row |",
    ]
    print("| quantity | value | how |\n|---|---|---|\n" + "\n".join(lines))


if __name__ == "__main__":
    app()
