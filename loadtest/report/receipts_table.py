"""The receipts run (``loadtest.receipts``) as a section of docs/benchmarks.md: what
delivery acks and read markers cost beside the same run's baseline."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.report.cells import figure, p50_p99, times
from loadtest.report.provenance import scenario_provenance

EVENT = {"acks": "delivered", "reads": "read"}  # the event each phase's client frames become
PROCESSES = (("daemons", "daemons"), ("writer", "writer"), ("relay", "relay"), ("apis", "API"))


def receipts_table(r: dict) -> list[str]:
    """The section: provenance, one row per phase, the ratios to the baseline, memory, the clients' cost."""
    p, mem = r["parameters"], r["memory"]
    lines = [
        "## Receipts and read markers (`python -m loadtest.receipts`)", "",
        scenario_provenance(r), "",
        f"{p['clients']:,} WebSocket clients (one user each), {p['rate']:g} msg/s posted through the API between"
        f" random pairs for {p['seconds_per_phase']:g} s a phase, on one system and the same connections; the"
        f" phases alternated (baseline, acks, reads) {p['rounds']} time(s), and their rounds are pooled."
        " **baseline**: the clients only read; **acks**: every client acks every message frame on its socket"
        " (`{\"type\": \"ack\", \"upto\": id}`); **reads**: every client sends a `read` frame for every message"
        " addressed to it. Message delivery = POST → frame on the socket; event delivery = the client's ack or"
        " read frame sent → the `delivered` or `read` frame on the peer's socket (matched by actor and `upto`)."
        " CPU per message = the processes' CPU time (/proc) over the send window and the settling after it, over"
        " the messages posted. Rows = rows of the stream written to MySQL, per message posted.", "",
        "| phase | messages | message delivery p50/p99 ms | event | event delivery p50/p99 ms | client frames sent"
        " | rows per message | daemons µs/msg | writer µs/msg | relay µs/msg | API µs/msg | host busy | stolen |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in r["phases"].items():
        event = EVENT.get(name)
        sent = sum(row["frames_sent"].values())
        rows = ", ".join(f"{k} {figure(v)}" for k, v in sorted(row["rows_per_message"].items()))
        cpu = row["cpu_us_per_message"]
        lines.append(
            f"| {name} | {figure(row['messages'])} | {p50_p99(row['message_ms'])} | {event or '–'} | "
            f"{p50_p99(row['event_ms'].get(event)) if event else '–'} | {figure(sent)} | {rows or '–'} | "
            + " | ".join(figure(cpu.get(key)) for key, _ in PROCESSES)
            + f" | {'/'.join(figure(b) for b in row['busy_pct'])} %"
              f" | {'/'.join(figure(s) for s in row['steal_pct'])} % |")
    lines += ["", "Ratios to the baseline of the same run:", "",
              "| phase | message p50 | message p99 | " + " | ".join(f"{label} CPU" for _, label in PROCESSES) + " |",
              "|---|---|---|" + "---|" * len(PROCESSES)]
    for name, q in r["ratios"].items():
        lines.append(f"| {name} | {times(q['message_p50'])} | {times(q['message_p99'])} | "
                     + " | ".join(times(q.get(f"cpu_{key}")) for key, _ in PROCESSES) + " |")
    verdict = "within" if mem["within_limit"] else "**over**"
    cost = r["client_cost"]
    lines += ["", f"Daemons' memory per idle WebSocket connection ({mem['held']:,} held, before any traffic):"
              f" {figure(mem['pss_kb_per_conn'])} KB PSS, {figure(mem['rss_kb_per_conn'])} KB RSS growth, {verdict} the"
              f" {figure(mem['limit_kb'])} KB limit ({figure(mem.get('pss_kb_per_conn_second_half'))} KB PSS per"
              " connection of the second half alone, without what the first connections grew once); after the phases"
              " (recent caches filled, each connection's"
              f" coalescer made) {figure(mem['pss_kb_per_conn_after_phases'])} KB PSS."
              f" The load clients ({cost['what']}) cost {figure(cost['cpu_us_per_frame'])} µs of CPU per frame"
              f" received or sent, and the sender {figure(cost['sender_cpu_us_per_message'])} µs per POST: that CPU is"
              " taken from the same cores as the server's.",
              "", f"{figure(r['sent'])} of {figure(r['asked'])} messages stored; {figure(r['lost'])} lost,"
              f" {figure(r['duplicates'])} duplicated, {figure(r['error_frame_count'])} error frames,"
              f" {figure(r['closed'])} connections closed,"
              f" {figure(r['unmatched_events'])} events matched to no client frame (and"
              f" {figure(r.get('catch_up_events'))} answered the catch-up acks before each acks phase, outside"
              " its window)."
              + (f" **FAILED: {r['failed']}**" if r.get("failed") else ""), ""]
    return lines


def receipts_tables(results: Path) -> list[str]:
    path = results / "receipts-latest.json"
    return receipts_table(json.loads(path.read_text())) if path.exists() else []
