"""The receipts run (``loadtest.receipts``) as a section of docs/benchmarks.md: what
delivery acks and read markers cost beside the same run's baseline."""

from __future__ import annotations

import json
from pathlib import Path

EVENT = {"acks": "delivered", "reads": "read"}  # the event each phase's client frames become
PROCESSES = (("daemons", "daemons"), ("writer", "writer"), ("relay", "relay"), ("apis", "API"))


def _v(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _pair(figures: dict | None) -> str:
    return "–" if not figures else f"{_v(figures['p50'])}/{_v(figures['p99'])}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def receipts_table(r: dict) -> list[str]:
    """The section: provenance, one row per phase, the ratios to the baseline, memory, the clients' cost."""
    m, p, mem = r["machine"], r["parameters"], r["memory"]
    shape = r.get("deployed", {})
    lines = [
        "## Receipts and read markers (`python -m loadtest.receipts`)", "",
        f"_Measured {m['date']} at commit {m['commit']}, on {m['cores']} cores that every process shares with the"
        f" load generators, {m['ram_gib']} GiB RAM; {m['mongo']}, MariaDB {m['mysql']}. As `make run` deploys it:"
        f" {shape.get('apis', '?')} API processes writing through the writer process and {shape.get('daemons', '?')}"
        f" daemons tailing the oplog through the relay process._", "",
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
        rows = ", ".join(f"{k} {_v(v)}" for k, v in sorted(row["rows_per_message"].items()))
        cpu = row["cpu_us_per_message"]
        lines.append(
            f"| {name} | {_v(row['messages'])} | {_pair(row['message_ms'])} | {event or '–'} | "
            f"{_pair(row['event_ms'].get(event)) if event else '–'} | {_v(sent)} | {rows or '–'} | "
            + " | ".join(_v(cpu.get(key)) for key, _ in PROCESSES)
            + f" | {'/'.join(_v(b) for b in row['busy_pct'])} % | {'/'.join(_v(s) for s in row['steal_pct'])} % |")
    lines += ["", "Ratios to the baseline of the same run:", "",
              "| phase | message p50 | message p99 | " + " | ".join(f"{label} CPU" for _, label in PROCESSES) + " |",
              "|---|---|---|" + "---|" * len(PROCESSES)]
    for name, q in r["ratios"].items():
        lines.append(f"| {name} | {_x(q['message_p50'])} | {_x(q['message_p99'])} | "
                     + " | ".join(_x(q.get(f"cpu_{key}")) for key, _ in PROCESSES) + " |")
    verdict = "within" if mem["within_limit"] else "**over**"
    cost = r["client_cost"]
    lines += ["", f"Daemons' memory per idle WebSocket connection ({mem['held']:,} held, before any traffic):"
              f" {_v(mem['pss_kb_per_conn'])} KB PSS, {_v(mem['rss_kb_per_conn'])} KB RSS growth, {verdict} the"
              f" {_v(mem['limit_kb'])} KB limit ({_v(mem.get('pss_kb_per_conn_second_half'))} KB PSS per connection"
              " of the second half alone, without what the first connections grew once); after the phases"
              " (recent caches filled, each connection's"
              f" coalescer made) {_v(mem['pss_kb_per_conn_after_phases'])} KB PSS."
              f" The load clients ({cost['what']}) cost {_v(cost['cpu_us_per_frame'])} µs of CPU per frame"
              f" received or sent, and the sender {_v(cost['sender_cpu_us_per_message'])} µs per POST: that CPU is"
              " taken from the same cores as the server's.",
              "", f"{_v(r['sent'])} of {_v(r['asked'])} messages stored; {_v(r['lost'])} lost, {_v(r['duplicates'])}"
              f" duplicated, {_v(r['error_frame_count'])} error frames, {_v(r['closed'])} connections closed,"
              f" {_v(r['unmatched_events'])} events matched to no client frame (and"
              f" {_v(r.get('catch_up_events'))} answered the catch-up acks before each acks phase, outside its window)."
              + (f" **FAILED: {r['failed']}**" if r.get("failed") else ""), ""]
    return lines


def receipts_tables(results: Path) -> list[str]:
    path = results / "receipts-latest.json"
    return receipts_table(json.loads(path.read_text())) if path.exists() else []
