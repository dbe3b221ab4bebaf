"""The offline-push run (``loadtest.push``) as a section of docs/benchmarks.md: the
pusher's notifications against MySQL's expected set, their delay, the pusher's CPU,
and live delivery while the gateway fails."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.report.cells import figure, p50_p99, times
from loadtest.report.provenance import scenario_provenance

HEADING = "## Offline push (`python -m loadtest.push`)"
RESULT_FILE = "push-latest.json"
GATEWAY_MODE = {"ok": "200", "fail": "500", "stall": "holds requests"}


def _per_message(row: dict) -> float | None:
    """The pusher's CPU over a phase (its send window, and the normal phase's settling) per message posted."""
    cpu = row.get("pusher_cpu_seconds")
    return round(cpu / row["sent"] * 1e6, 1) if cpu is not None and row["sent"] else None


def push_table(r: dict) -> list[str]:
    """The section: provenance, what was run and checked, one row per phase, the totals."""
    p, push, online, cpu = r["parameters"], r["push"], r["online"], r["pusher_cpu"]
    lines = [
        HEADING, "",
        scenario_provenance(r, beside="the load generators and the gateway",
                            also="the pusher; the push gateway is our own"
                            " (harness/push_gateway.py), a process that records each notification's arrival"),
        "",
        f"{p['users']:,} users: {p['online']:,} online on WebSockets, each acking every message frame it receives"
        f" (`{{\"type\": \"ack\", \"upto\": id}}`), and {p['offline']:,} offline with one registered device each."
        f" {p['rate']:g} msg/s posted through the API between random pairs for {p['seconds_per_phase']:g} s a"
        " phase: **normal** (the gateway answers 200; the next phase starts once its pushes have all arrived),"
        f" **outage** (the gateway {GATEWAY_MODE.get(p['outage'], p['outage'])} for the whole send window) and"
        " **recovery** (200 again, while the pusher retries what the outage refused), then a drain until every"
        f" message is decided and the outbox is empty. `CHAT_PUSH_DELAY_SECONDS` = {p['push_delay_seconds']:g} s,"
        " and it is inside every push delay below.", "",
        "Expected, computed after the run from MySQL by the pusher's rule (docs/push.md): each message to a user"
        " with a registered device, from someone else, not deleted, above the highest position any of the user's"
        " devices acknowledged and above their read marker for the sender, within the pusher's decided range. A"
        " notification names the newest message of its window (`event_id`): an expected message is **covered**"
        " by the notification to that device with the smallest `event_id` at or above it, **missing** without"
        " one; a notification whose `event_id` is not an expected message is **unexpected**; an"
        " `Idempotency-Key` taken twice is **duplicated**. Push delay = the message's `created_at` → the covering"
        " notification's first arrival at the gateway, per missed message (and for the newest message of each"
        " notification alone); phases by `created_at`. Online delivery = POST → frame on the recipient's or"
        " sender's socket.", "",
        "| phase | gateway | messages | online delivery p50/p99 ms | push delay p50/p99 ms, every missed message"
        " | push delay p50/p99 ms, newest of each notification | notifications taken in the phase"
        " | requests refused in the phase | pusher CPU µs per message posted |",
        "|---|---|---|---|---|---|---|---|---|"]
    for name, row in r["phases"].items():
        lines.append(
            f"| {name} | {GATEWAY_MODE.get(row['gateway_mode'], row['gateway_mode'])} | {figure(row['sent'])} | "
            f"{p50_p99(row['online_delivery_ms'])} | {p50_p99(row['push_delay_ms'])} | "
            f"{p50_p99(row['push_delay_newest_ms'])} | {figure(row['gateway_taken'])}"
            f" | {figure(row['gateway_refused'])} | {figure(_per_message(row))} |")
    effect = r["outage_effect"]
    per = push["messages_per_notification"]
    lines += [
        "", f"**{figure(push['notifications'])} notifications for {figure(push['expected_messages'])} missed messages**"
        f" ({figure(push['expected_users'])} users; {figure(per['mean'])} messages per notification, at most"
        f" {figure(per['max'])}): **{figure(push['missing'])} missing, {figure(push['duplicates'])}"
        f" duplicated, {figure(push['unexpected'])} unexpected**; push delay over the whole run"
        f" {p50_p99(push['delay_all_ms'])} ms (p50/p99); the gateway refused {figure(push['gateway_refused'])}"
        f" requests; drained {figure(push['drain_seconds'])} s after the last phase.",
        "", f"The pusher's CPU (/proc of its pid, {cpu['window']}, {figure(cpu.get('window_seconds'))} s):"
        f" {figure(cpu['us_per_notification'])} µs per notification taken, the outage's refused attempts included"
        f" ({figure(cpu.get('us_per_notification_net'))} µs net of what it costs idle, {figure(cpu.get('idle_cores'))}"
        " cores measured before the phases: its steps poll MySQL every 0.1 s);"
        f" {figure(cpu.get('normal_us_per_notification'))} µs per notification in the normal phase alone (its send"
        f" window and settling, no refusal); {figure(cpu['us_per_message'])} µs per message posted (every row is"
        " decided, pushed or not).",
        "", f"Online delivery in the outage against the normal phase: p50 {times(effect['online_p50'])}, p99"
        f" {times(effect['online_p99'])}. {figure(online['held'])} of {figure(online['clients'])} online clients held,"
        f" {figure(r['sent'])} of {figure(r['asked'])} messages stored; {figure(online['lost'])} lost,"
        f" {figure(online['duplicates'])} duplicated on the sockets, {figure(online['acks_sent'])} acks sent,"
        f" {figure(online['error_frame_count'])} error frames, {figure(online['closed'])} connections closed."
        + (f" **FAILED: {r['failed']}**" if r.get("failed") else ""), ""]
    return lines


def push_tables(results: Path) -> list[str]:
    path = results / RESULT_FILE
    if path.exists():
        return push_table(json.loads(path.read_text()))
    return [HEADING, "", "No published run yet: `.venv/bin/python -m loadtest.push --publish` writes"
            f" `loadtest/results/{RESULT_FILE}` and this section.", ""]
