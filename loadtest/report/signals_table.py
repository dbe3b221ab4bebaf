"""The signals run (``loadtest.signals``) as a section of docs/benchmarks.md: typing latency and
CPU per signal, memory per connection with and without a watch list, message delivery beside
typing, and a reconnect storm."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.report.cells import figure, p50_p99, times
from loadtest.report.provenance import scenario_provenance

PROCESSES = (("daemons", "daemons"), ("redis", "Redis"), ("writer", "writer"), ("relay", "relay"), ("apis", "API"))


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:g} %"


def _counter(counters: dict, kind: str, outcome: str) -> str:
    return figure(int(counters.get(f'chat_daemon_signals_total{{kind="{kind}",outcome="{outcome}"}}', 0)))


def signals_table(r: dict) -> list[str]:
    """The section: provenance, one row per phase, the ratios, CPU per signal, memory, the storm."""
    m, p, mem, t = r["machine"], r["parameters"], r["memory"], r["typing"]
    phases = r["phases"]
    lines = [
        "## Typing and presence (`python -m loadtest.signals`)", "",
        scenario_provenance(r, servers_also=f", {m.get('redis', 'Redis')} (the signals' carrier, docs/presence.md)"),
        "",
        f"{p['clients']:,} WebSocket clients (one user each), each watching {p['watch']} others (a `watch` frame"
        " after its hello; every snapshot awaited), on one system and the same connections. Phases alternated"
        f" {p['rounds']} time(s), {p['seconds_per_phase']:g} s each, their rounds pooled: **typing**:"
        f" {p['typing_rate']:g} typing refreshes a second (`{{\"type\": \"typing\", \"to\": peer, \"state\":"
        " \"start\"}`) from random clients to a random one of the users they watch, no client to one peer more"
        f" often than every {figure(p.get('pair_gap_seconds'))} s (the daemons' throttle, a second, passes every one);"
        " **messages**:"
        f" {p['rate']:g} msg/s posted through the API between random pairs; **messages+typing**: both at once."
        " Typing latency = the frame sent → the `typing` frame on the peer's socket (matched by from and to, a"
        " pair's frames to its sends in order); message delivery = POST → frame on the socket, and posted/s the"
        " rate the POSTs were answered at (the sender's target is the rate above). CPU per signal = the"
        " processes' CPU time (/proc) over the window and its settling, over the typing frames sent.", "",
        "| phase | typing frames sent | typing p50/p99 ms | messages (posted/s) | message delivery p50/p99 ms"
        " | daemons µs/signal | Redis µs/signal | daemons µs/msg | host busy | stolen |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in phases.items():
        per_signal, per_message = row["cpu_us_per_signal"], row["cpu_us_per_message"]
        lines.append(
            f"| {name} | {figure(row['typing_sent'])} | {p50_p99(row['typing_ms'])} | {figure(row['messages'])}"
            + (f" ({figure(row.get('posted_per_s'))})" if row["messages"] else "") + " |"
            f" {p50_p99(row['message_ms'])} | {figure(per_signal.get('daemons'))} | {figure(per_signal.get('redis'))} |"
            f" {figure(per_message.get('daemons'))} | {'/'.join(figure(b) for b in row['busy_pct'])} % |"
            f" {'/'.join(figure(x) for x in row['steal_pct'])} % |")
    q = r["ratios"]
    lines += ["", "messages+typing against the same run's messages alone (message delivery, and each process's CPU"
              " per second of window), and its typing against typing alone:", "",
              "| message p50 | message p99 | typing p50 | typing p99 | "
              + " | ".join(f"{label} CPU" for _, label in PROCESSES) + " |",
              "|---|---|---|---|" + "---|" * len(PROCESSES),
              f"| {times(q['message_p50'])} | {times(q['message_p99'])} | {times(q['typing_p50'])}"
              f" | {times(q['typing_p99'])} | "
              + " | ".join(times(q.get(f"cpu_{key}")) for key, _ in PROCESSES) + " |"]
    alone = phases["typing"]
    marginal = r["marginal_us_per_signal"]
    counters = r["daemon_counters"]
    lines += ["", f"The daemons' CPU per signal, typing alone: {figure(alone['cpu_us_per_signal'].get('daemons'))} µs"
              f" ({figure(alone['daemons_net_us_per_signal'])} µs net of what the {p['clients']:,} idle"
              f" connections cost them, {figure(r['idle_daemon_cores'])} cores measured before the phases); beside"
              f" the messages, what typing added: {figure(marginal.get('daemons'))} µs per signal (Redis"
              f" {figure(marginal.get('redis'))})."
              " Each signal is read by both daemons (each subscribes to its partitions' typing channel) and"
              f" written by the one that holds the peer. Typing over the run: {figure(t['sent'])} frames sent,"
              f" {figure(t['matched'])} arrived on the peer's socket ({figure(t['missing'])} never did,"
              f" {figure(t['unmatched'])} matched no send), p50/p99 {p50_p99(t['all_ms'])} ms. The daemons counted"
              f" {_counter(counters, 'typing', 'published')} published, {_counter(counters, 'typing', 'received')}"
              f" received, {_counter(counters, 'typing', 'throttled')} throttled,"
              f" {_counter(counters, 'typing', 'dropped')} dropped."]
    verdict = "within" if mem["within_limit"] else "**over**"
    receipts = mem.get("receipts_published")
    before = (f" The published receipts run measured {figure(receipts['pss_kb_per_conn'])} KB PSS the same way"
              f" ({figure(receipts['held'])} held, commit {receipts['commit']}, before presence existed)."
              if receipts else "")
    lines += ["", f"Daemons' memory per idle WebSocket connection ({figure(mem['held'])} held, before any traffic;"
              " loadtest.receipts' method: PSS and RSS growth of the daemon processes over the connections held):"
              f" **without a watch list** {figure(mem['pss_kb_per_conn'])} KB PSS,"
              f" {figure(mem['rss_kb_per_conn'])} KB RSS, {verdict} the {figure(mem['limit_kb'])} KB target"
              f" ({figure(mem.get('pss_kb_per_conn_second_half'))} KB PSS per connection of the second half alone);"
              " **with a"
              f" {p['watch']}-user watch list** {figure(mem['pss_kb_per_conn_watching'])} KB PSS,"
              f" {figure(mem['rss_kb_per_conn_watching'])} KB RSS ({figure(mem['pss_kb_per_watch_list'])} KB per watch"
              f" list); after the phases {figure(mem['pss_kb_per_conn_after_phases'])} KB PSS.{before}"
              f" {figure(mem['snapshots'])} snapshots in {figure(mem['watch_seconds'])} s"
              f" ({figure(mem.get('snapshots_per_s'))} a second, {figure(p.get('watch_window'))} watch frames"
              " awaiting theirs at a time), with"
              f" {_pct(mem['snapshot_online_share'])} of the watched users online in them (all were connected)."]
    lines += ["", "Reconnect storms, one after the other: the clients' sockets dropped at once (no close frame) and all"
              " reconnected at once, each with its resume point (`since`); counted from the first drop to the grace"
              f" ({figure(p.get('grace_seconds'))} s) and a `last_seen` store period after the last one was back."
              " Rows changed = rows of MySQL's `presence` whose `last_seen` changed (of users back within the grace"
              " as the client saw it / after it); published = changes on the `chat:presence:{user}` channels,"
              " counted by a subscriber of the benchmark's own (offline/online); offline after = users connected"
              " again whom Redis lists on no"
              " daemon once it was over; Redis commands = those it ran meanwhile, its scripts' own included.", "",
              "| clients | all back in s | drop → hello p50/p99/max ms | over the grace | rows changed (within/after)"
              " | published (offline/online) | presence frames to watchers | offline after | Redis commands |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in r["storms"]:
        gaps, commands = s["gap_ms"], s["redis_commands"]
        by_name = ", ".join(f"{k} {figure(v)}" for k, v in commands.items() if k != "all")
        lines.append(
            f"| {figure(s['clients'])} | {figure(s['back_seconds'])} |"
            f" {figure(gaps['p50'])}/{figure(gaps['p99'])}/{figure(gaps['max'])}"
            f" | {figure(s['gaps_over_grace'])} | **{figure(s['last_seen_changed'])}**"
            f" ({figure(s['changed_back_within_grace'])}/{figure(s['changed_back_after_grace'])})"
            f" | **{figure(s['published'])}** ({figure(s['published_offline'])}/{figure(s['published_online'])})"
            f" | {figure(s['presence_frames_to_watchers'])} |"
            f" {figure(s['offline_while_connected'])} | {figure(commands.get('all'))} ({by_name}) |")
    lines += ["", "A user back on the daemon it left, within the grace, costs Redis nothing; one back on the other"
              " daemon is announced there (a script, no publication) and withdrawn from the first after the grace"
              f" (another). At the first connections, {figure(r['online_published_at_connect'])} online changes were"
              " published.",
              "", f"{figure(r['sent'])} of {figure(r['asked'])} messages stored; {figure(r['lost'])} lost,"
              f" {figure(r['duplicates'])} duplicated, {figure(r['error_frame_count'])} error frames"
              f" ({', '.join(f'{k} {figure(n)}' for k, n in r.get('error_codes', {}).items()) or 'none'}; a watch"
              f" answered by one is sent again a second later: {figure(mem.get('watch_failed'))} given up),"
              f" {figure(r['closed'])} connections closed by the server."
              + (f" **FAILED: {r['failed']}**" if r.get("failed") else "")]
    if r.get("not_measured"):
        lines += ["", f"Not measured here: {r['not_measured']}"]
    return lines + [""]


def signals_tables(results: Path) -> list[str]:
    path = results / "signals-latest.json"
    return signals_table(json.loads(path.read_text())) if path.exists() else []
