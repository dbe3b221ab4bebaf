"""The A/B tables of docs/benchmarks.md: one per loadtest.common.compare result
(compare-*.json) and one for loadtest.hole_fill's (hole_fill.json).

Each table says what was compared, when and on what, from the file itself;
the pure functions take the parsed JSON, comparison_tables reads the files."""

from __future__ import annotations

import json
from pathlib import Path

# (label, key in a compare file's "medians", key in its older "medians_p50")
_COLUMNS = (("delivery p50", "e2e_ms.p50", "e2e_ms"), ("delivery p99", "e2e_ms.p99", "e2e_p99"),
            ("FerretDB's own tail p50", "ferretdb_tail_ms.p50", "ferretdb_tail_ms"),
            ("FerretDB's own tail p99", "ferretdb_tail_ms.p99", None),
            ("gap p50", "gap.p50", "gap_p50"), ("gap p99", "gap.p99", "gap_p99"),
            ("creation p50", "creation_ms.p50", "creation_ms"),
            ("stored → in FerretDB p50", "mongo_lag_ms.p50", "mongo_lag_ms"))


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _when(data: dict) -> str:
    m = data.get("machine")
    if m is None:
        return "The file records no machine; its note says what it holds."
    return (f"Run {m['date']} on {m['cores']} cores shared with the load generators, {m['ram_gib']} GiB RAM;"
            f" {m['mongo']}, MariaDB {m['mysql']}.")


def compare_table(name: str, data: dict) -> list[str]:
    """Medians per revision of one interleaved A/B (`python -m loadtest.common.compare`)."""
    revisions = list(data["runs"])
    rounds = data.get("rounds") or len(data["runs"][revisions[0]])
    clients, rate = data.get("clients", 10_000), data.get("rate", 1000)
    title = f"`{name}`: {' against '.join(revisions)}, {clients:,} WebSocket clients at {rate:,g} msg/s"
    lines = [f"### {title}", "", f"_{_when(data)} {rounds} alternating rounds per revision, fresh databases each,"
             " as deployed; medians over the rounds, ms. Gap = delivery minus FerretDB's own insert → tail in the"
             " same run._", ""]
    if data.get("what"):
        lines += [data["what"], ""]
    lines += ["| revision | " + " | ".join(label for label, _new, _old in _COLUMNS) + " |",
              "|---" * (len(_COLUMNS) + 1) + "|"]
    medians = data.get("medians") or {}
    for rev in revisions:
        if rev in medians:
            cells = [_ms(medians[rev].get(new)) for _label, new, _old in _COLUMNS]
        else:
            old = data["medians_p50"][rev]
            cells = [_ms(old.get(key)) if key else "–" for _label, _new, key in _COLUMNS]
        lines.append(f"| {rev} | " + " | ".join(cells) + " |")
    return lines + [""]


def hole_fill_table(data: dict) -> list[str]:
    """loadtest.hole_fill: where a daemon reads the ids its tail skipped."""
    lines = ["### `hole_fill.json`: holes read from MySQL against from the `messages` collection", "",
             f"_{_when(data)} Commit {data['machine']['commit']}. {data['what']}._", "",
             "| holes read from | POST/s | p50 ms | p99 ms | max ms | errors | fall-offs | filled from MySQL "
             "| every message delivered, s after the run | FerretDB cores | lost | dup |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        lines.append(f"| {row['variant']} | {row['rps']:,.0f} | {row['p50_ms']:g} | {row['p99_ms']:g} | "
                     f"{row['max_ms']:g} | {row['errors']:g} | {row.get('fall_offs', '–')} | "
                     f"{row.get('fills_from_mysql', '–')} | {row['caught_up_after_s']:g} | {row['ferretdb_cores']:g} | "
                     f"{row['lost']} | {row['duplicated']} |")
    return lines + [""]


def tiers_table(name: str, data: dict) -> list[str]:
    """Medians per revision of `python -m loadtest.common.compare_tiers`: the write path and the daemon tier."""
    revisions = list(data["runs"]["ab"])
    lines = [f"### `{name}`: {' against '.join(revisions)}, the write path and the daemon tier", "",
             f"_{_when(data)} {data['rounds']} alternating rounds per revision. ab: `ab -k -c 100` on POST for "
             f"{data['ab_seconds']:g} s, as deployed. replay: {data['replay_messages']:,} recorded oplog entries "
             f"as fast as they go into one daemon holding {data['replay_clients']:,} clients._", "",
             "| revision | POST/s | p50 ms | p99 ms | errors | replay msg/s | daemon CPU µs/msg | lost | dup |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rev in revisions:
        ab, rp = data["medians"]["ab"][rev], data["medians"]["replay"][rev]
        lines.append(f"| {rev} | {ab['rps']:,.0f} | {ab['p50_ms']:g} | {ab['p99_ms']:g} | {ab['errors']:g} | "
                     f"{rp['messages_per_s']:,.0f} | {rp['daemon_cpu_us_per_message']:g} | {rp['lost']:g} | "
                     f"{rp['duplicates']:g} |")
    return lines + [""]


def restart_tables(results: Path) -> list[str]:
    """A fresh daemon's start-up (loadtest.startup); a host's clients back after a restart
    (loadtest.restart_reconnect)."""
    lines = ["## Restarts (`python -m loadtest.startup`, `python -m loadtest.restart_reconnect`)", ""]
    startup, reconnect = results / "startup-latest.json", results / "restart-reconnect-latest.json"
    if startup.exists():
        data = json.loads(startup.read_text())
        lines += [f"_{_when(data)} Commit {data['machine']['commit']}. {data['what']}, "
                  f"{data['messages']:,} messages stored._", "", "| start | ready after, s | idle RSS, MB |",
                  "|---|---|---|"]
        lines += [f"| {i + 1} | {run['ready_seconds']:g} | {run['idle_rss_mb']:g} |"
                  for i, run in enumerate(data["runs"])]
        lines.append("")
    if reconnect.exists():
        data = json.loads(reconnect.read_text())
        lines += [f"_{_when(data)} Commit {data['machine']['commit']}. {data['what']}, {data['messages']:,} "
                  "messages stored, two daemons._", "", "| clients | connected in, s | back after the restart, s |",
                  "|---|---|---|", f"| {data['reconnected']:,} of {data['clients']:,} | {data['connect_seconds']:g} | "
                  f"{data['all_back_seconds']} |", ""]
    return lines


def comparison_tables(results: Path) -> list[str]:
    """Every A/B result kept in the results folder, oldest first."""
    lines = ["## A/B comparisons (`python -m loadtest.common.compare`, `python -m loadtest.hole_fill`)", ""]
    hole_fill = results / "hole_fill.json"
    if hole_fill.exists():
        lines += hole_fill_table(json.loads(hole_fill.read_text()))
    compares = [(path.name, json.loads(path.read_text())) for path in results.glob("compare-*.json")]
    compares.sort(key=lambda item: item[0])
    for name, data in compares:
        lines += tiers_table(name, data) if name.startswith("compare-tiers-") else compare_table(name, data)
    return lines + restart_tables(results)
