"""Markdown report and PNG plots from a benchmark's JSON result."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _fmt(v) -> str:
    return "–" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _stolen(run: dict) -> str:
    """The hypervisor's steal during the run (runs from before it was measured: –)."""
    host = run.get("host_cpu")
    return "–" if host is None else f"{host['steal_pct']:g} %"


def _stored(run: dict) -> str:
    s = run.get("stored_to_client_ms")
    return "–" if s is None else f"{_fmt(s['p50'])}/{_fmt(s['p99'])}"


def _lag(run: dict) -> str:
    """The writer's created_at -> in Mongo (runs recorded without it: –)."""
    s = run.get("mongo_lag_ms")
    return "–" if s is None else f"{_fmt(s['p50'])}/{_fmt(s['p99'])}"


def write_report(r: dict, out: Path) -> None:
    m = r["machine"]
    lines = [
        "# Benchmark report", "",
        f"{r['mode']} run, {m['date']}, commit {m['commit']}, {m['cores']} cores, {m['ram_gib']} GiB RAM.",
        f"Backing servers: **{m['mongo']}**, {m['mysql']}. Everything on one machine over loopback,"
        " load generators included. Figures that pass through FerretDB say so.", ""]
    for name, rerun in r.get("reruns", {}).items():
        lines += [f"Section `{name}` rerun on its own (`--only {name}`): {rerun['date']}, commit {rerun['commit']}.", ""]
    for failure in r.get("failures", []):
        lines += [f"**{failure}** (the run's row below carries the figures it had).", ""]
    for name, shape in r.get("deployed", {}).items():
        writer = " writing through the writer process" if shape.get("writer") else ""
        tail = ", tailing the oplog through the relay process" if shape.get("relay") else ", each tailing the oplog"
        lines += [f"Section `{name}` ran the system as `make run` deploys it: {shape['apis']} API process(es)"
                  f"{writer} and {shape['daemons']} daemons{tail}.", ""]
    lines += [
        "## ab -k on the daemons' long-poll endpoint (writer at a fixed rate)", "",
        "| connections | complete requests | requests/s | time per request (ms, across all) | min ms | max ms "
        "| errors | seed best requests/s | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for row in r["ab"]["poll"]:
        lines.append(f"| {row['concurrency']} | {row['complete']:g} | {row['rps']:g} | {row['tpr_all_ms']:g} | "
                     f"{row['min_ms']:g} | {row['max_ms']:g} | {row['errors']:g} | "
                     f"{_fmt(max(row['seed_rps']) if row['seed_rps'] else None)} | {_fmt(row['ratio_vs_best_seed'])}× |")
    lines += ["", f"Command: `{r['ab']['poll'][0]['command']}`", "",
              "## ab -k on POST /v1/messages (MySQL + FerretDB in the path)", "",
              "| connections | complete requests | requests/s | time per request (ms, across all) | min ms "
              "| p50 ms | p99 ms | max ms | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for row in r["ab"]["post"]:
        lines.append(f"| {row['concurrency']} | {row['complete']:g} | {row['rps']:g} | {row['tpr_all_ms']:g} | "
                     f"{row['min_ms']:g} | {row['p50_ms']:g} | {row['p99_ms']:g} | {row['max_ms']:g} | "
                     f"{row['errors']:g} |")
    lines += ["", f"Command: `{r['ab']['post'][0]['command']}`", ""]
    if r.get("post_alone"):
        lines += ["## ab -k on POST /v1/messages, the write path alone (no daemon tailing FerretDB)", "",
                  "| API processes | connections | complete requests | requests/s | time per request (ms, across all) "
                  "| min ms | p50 ms | p99 ms | max ms | errors |", "|---|---|---|---|---|---|---|---|---|---|"]
        for row in r["post_alone"]:
            apis = f"{row['apis']} + writer process" if row.get("writer") else row["apis"]
            lines.append(f"| {apis} | {row['concurrency']} | {row['complete']:g} | {row['rps']:g} | "
                         f"{row['tpr_all_ms']:g} | {row['min_ms']:g} | {row['p50_ms']:g} | {row['p99_ms']:g} | "
                         f"{row['max_ms']:g} | {row['errors']:g} |")
        lines += ["", f"Averages of {r['post_alone'][0]['iterations']} runs each.", ""]
    lines += ["## WebSocket clients (creation / fan-out / delivery, as delivery servers publish)", "",
              "creation = POST round trip (API and MySQL commit; the writer answers before its FerretDB insert); fan-out = oplog entry received → frame written,"
              " inside the daemon; delivery = send → receive, end to end; stored → client = from the MySQL commit's "
              "time stamp (`created_at`, whole ms) to receipt: the writer's FerretDB insert, the daemon's tail, "
              "fan-out and the client's read, i.e. the part to compare with FerretDB tail = its own insert → "
              "tail latency, measured in the same run, over its send window (after every client connected); "
              "stored → in FerretDB = the writer's own histogram, per message, from its `created_at` stamp (just before its MySQL "
              "INSERT) to the return of the FerretDB insert that holds it: the MySQL commit, the wait for the "
              "insert ahead, then its own (interpolated within buckets). Host CPU stolen = the share of the machine's CPU time that "
              "the hypervisor gave to other guests during the run (steal, /proc/stat): this is a shared virtual "
              "machine, and what it steals shows up as latency.", "",
              "| clients | msg/s | creation p50/p99 ms | fan-out p50/p99 ms (bucket bound) | delivery p50/p90/p99/max ms "
              "| stored → client p50/p99 ms | stored → in FerretDB p50/p99 ms | FerretDB tail p50/p99 ms | delivered/s | lost "
              "| dup | daemon KB/conn | host CPU stolen |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in r["ws"]:
        c, f, e, t = w["creation_ms"], w["fanout_ms"], w["e2e_ms"], w["ferretdb_tail_ms"]
        lines.append(f"| {w['clients']} | {w['rate']:g} | {_fmt(c['p50'])}/{_fmt(c['p99'])} | "
                     f"{_fmt(f['p50'])}/{_fmt(f['p99'])} | {_fmt(e['p50'])}/{_fmt(e['p90'])}/{_fmt(e['p99'])}/"
                     f"{_fmt(e['max'])} | {_stored(w)} | {_lag(w)} | {_fmt(t['p50'])}/{_fmt(t['p99'])} | {w['delivered_per_s']:g} | "
                     f"{w['lost']} | {w['duplicates']} | {w['daemon_rss_kb_per_conn']:g} | {_stolen(w)} |")
    lines += ["", "![latency against connections](latency_vs_connections.png)",
              "![memory against connections](memory_vs_connections.png)", ""]
    if any("mongo_lag_ms" in w for w in r["ws"] + r.get("rates", [])):
        lines += ["Where a delivery's time goes, stage by stage (medians), beside FerretDB's own insert → tail:", "",
                  "![where the delivery time goes](delivery_breakdown.png)", ""]
    if r.get("rates"):
        lines += _rates_table(r["rates"])
    if r.get("hold"):
        h = r["hold"]
        lines += ["## Connections held at once", "",
                  f"{h['held']:,} of {h['clients']:,} WebSocket clients held by {len(h['per_daemon'])} daemon processes "
                  f"({', '.join(str(d['connections']) for d in h['per_daemon'])} each), from {h['client_procs']} "
                  f"client processes, connected in {h['connect_seconds']} s; {h['sent']} messages sent through the "
                  f"API meanwhile: **{h['lost']} lost, {h['duplicates']} duplicated**; daemon RSS "
                  f"{h['daemon_rss_kb_per_conn']} KB per connection ({h['daemon_rss_mb']} MB in all).", ""]
    if r.get("replay"):
        lines += _replay_table(r["replay"])
    (out / "report.md").write_text("\n".join(lines))
    _plots(r, out)


def _rates_table(runs: list[dict]) -> list[str]:
    lines = [f"## Through FerretDB at rising message rates ({runs[0]['clients']:,} WebSocket clients)", "",
             "The same measures as the table above, one system, the rate raised step by step. FerretDB CPU = "
             "the cores its whole process used during the send window (inserts, and the daemons' and the probe's tails): "
             "a tail re-reads the whole oplog on every poll, so most of it is spent whatever the rate.", "",
             "| msg/s | creation p50/p99 ms | fan-out p50/p99 ms (bucket bound) | delivery p50/p99 ms "
             "| stored → client p50/p99 ms | stored → in FerretDB p50/p99 ms | FerretDB tail p50/p99 ms | FerretDB CPU (cores) "
             "| host busy | lost | dup |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in runs:
        c, f, e, t = w["creation_ms"], w["fanout_ms"], w["e2e_ms"], w["ferretdb_tail_ms"]
        lines.append(f"| {w['rate']:g} | {_fmt(c['p50'])}/{_fmt(c['p99'])} | {_fmt(f['p50'])}/{_fmt(f['p99'])} | "
                     f"{_fmt(e['p50'])}/{_fmt(e['p99'])} | {_stored(w)} | {_lag(w)} | {_fmt(t['p50'])}/{_fmt(t['p99'])} | "
                     f"{_fmt(w.get('ferretdb_cores'))} | {w['host_cpu']['busy_pct']:g} % | {w['lost']} | "
                     f"{w['duplicates']} |")
    return lines + ["", "![latency against message rate through FerretDB](latency_vs_rate_ferretdb.png)", ""]


def _replay_table(runs: list[dict]) -> list[str]:
    lines = ["## The daemon tier alone: recorded FerretDB oplog entries replayed in-process", "",
             "No database on the path: `python -m loadtest.replay` feeds real oplog entries recorded from FerretDB "
             "to a daemon process in place of its tail; the rest (sequencer, hub, WebSocket server, sockets, "
             "clients in other processes that check every id) is the production code. oplog → socket is the "
             "daemon's histogram (bucket bounds); e2e adds the clients' own reading.", "",
             "Frames per message: 2 = to the recipient's and the sender's connections; 1 = the senders are "
             "offline, as when a server publishes to one user's channel (Centrifugo's unit). Host CPU stolen: "
             "as above. Full GC passes: the daemon's generation-2 collections during the run (how many, and "
             "the bucket of the longest): the event loop stands still through each.", "",
             "| clients | daemons | msg/s asked | frames per message | batch | messages/s delivered | frames/s "
             "| oplog→socket p50/p99 ms | share ≤ 5 ms | e2e p50/p99 ms | daemon CPU µs/msg | lost | dup "
             "| host CPU stolen | full GC passes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for x in runs:
        o, e = x["oplog_to_socket_ms"], x["e2e_ms"]
        lines.append(f"| {x['clients']} | {x['daemons']} | {x['rate']} | {1 if x.get('senders_offline') else 2} | "
                     f"{x['batch']} | {x['messages_per_s']} | "
                     f"{x['frames_per_s']} | {_fmt(o['p50'])}/{_fmt(o['p99'])} | {_fmt(o['share_within_5ms'])} | "
                     f"{_fmt(e['p50'])}/{_fmt(e['p99'])} | {x['daemon_cpu_us_per_message']} | {x['lost']} | "
                     f"{x['duplicates']} | {_stolen(x)} | {_full_gc(x)} |")
    return lines + ["", "![latency against message rate](latency_vs_rate.png)", ""]


def _full_gc(run: dict) -> str:
    full = run.get("gc_pauses", {}).get("2")
    if full is None:
        return "–"  # runs from before it was measured
    return f"{full['n']} (≤ {_fmt(full['max_ms_bucket'])} ms)" if full["n"] else "0"


def _latency_plot(x: list, runs: list[dict], series) -> plt.Axes:
    """p50 (solid) and p99 (dashed) of each (key, label, marker) series against x."""
    _fig, ax = plt.subplots(figsize=(7, 4))
    for key, label, marker in series:
        ax.plot(x, [run[key]["p50"] for run in runs], f"{marker}-", label=f"{label} p50")
        ax.plot(x, [run[key]["p99"] for run in runs], f"{marker}--", label=f"{label} p99")
    return ax


def _finish(ax: plt.Axes, xlabel: str, title: str, path: Path) -> None:
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=110)


BREAKDOWN = (("API and the writer's queue (send → created_at)", "tab:blue"),
             ("writer: MySQL commit, then into FerretDB", "tab:orange"),
             ("FerretDB → daemon (tail, relay), the client's read", "tab:gray"),
             ("daemon fan-out (bucket bound)", "tab:green"))


def _stages(run: dict) -> list[float]:
    """Median of each stage of a delivery, in ms. Medians of parts need not add
    up to the median of the whole; the rest is put in the FerretDB stage."""
    e, stored, lag, fan = (run[k]["p50"] for k in ("e2e_ms", "stored_to_client_ms", "mongo_lag_ms", "fanout_ms"))
    return [max(e - stored, 0), lag, max(stored - lag - fan, 0), fan]


def _breakdown_plot(sections: list[tuple[str, dict]], path: Path) -> None:
    """One bar per run of the ws and rates sections, named by section."""
    sections = [(name, w) for name, w in sections if w.get("mongo_lag_ms") and w["mongo_lag_ms"]["p50"] is not None
                and "stored_to_client_ms" in w]
    if not sections:
        return
    runs = [w for _name, w in sections]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(runs) + 2.6))
    labels = [f"{name}: {w['clients']:,} clients, {w['rate']:g} msg/s" for name, w in sections]
    left = [0.0] * len(runs)
    for i, (name, color) in enumerate(BREAKDOWN):
        widths = [_stages(w)[i] for w in runs]
        ax.barh(labels, widths, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, widths)]
    ax.scatter([w["ferretdb_tail_ms"]["p50"] for w in runs], labels, marker="|", s=300, color="black", zorder=3,
               label="FerretDB's own insert → tail (probe), p50")
    ax.invert_yaxis()
    ax.set_xlabel("ms (p50 of each stage)")
    ax.set_title("Where the delivery time goes, through FerretDB 1.24")
    fig.legend(fontsize=7, loc="lower center", ncol=2)
    fig.tight_layout(rect=(0, 0.11, 1, 1))
    fig.savefig(path, dpi=110)


def _plots(r: dict, out: Path) -> None:
    ws = r["ws"]
    n = [w["clients"] for w in ws]
    ax = _latency_plot(n, ws, (("e2e_ms", "delivery (end to end)", "o"), ("creation_ms", "creation (API)", "o")))
    if all("stored_to_client_ms" in w for w in ws):  # older result files lack it
        ax.plot(n, [w["stored_to_client_ms"]["p50"] for w in ws], "^-", label="stored → client p50")
    ax.plot(n, [w["ferretdb_tail_ms"]["p50"] for w in ws], "s:", label="FerretDB insert→tail p50")
    _finish(ax, "connected clients", f"Latency vs connections ({ws[0]['rate']:g} msg/s, FerretDB 1.24)",
            out / "latency_vs_connections.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(n, [w["daemon_rss_mb"] for w in ws], "o-", label="daemons' RSS, MB")
    ax2 = ax.twinx()
    ax2.plot(n, [w["daemon_rss_kb_per_conn"] for w in ws], "s--", color="tab:red", label="KB per connection")
    ax.set_xscale("log")
    ax.set_xlabel("connected clients")
    ax.set_ylabel("MB")
    ax2.set_ylabel("KB per connection")
    ax.set_title("Daemon memory vs connections")
    fig.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out / "memory_vs_connections.png", dpi=110)
    if r.get("rates"):
        runs = r["rates"]
        ax = _latency_plot([w["rate"] for w in runs], runs,
                           (("e2e_ms", "delivery (end to end)", "o"), ("ferretdb_tail_ms", "FerretDB insert→tail", "s")))
        ax.plot([w["rate"] for w in runs], [w["creation_ms"]["p50"] for w in runs], "^-", label="creation (API) p50")
        _finish(ax, "messages/s through the API",
                f"Latency vs message rate, {runs[0]['clients']} clients, through FerretDB 1.24",
                out / "latency_vs_rate_ferretdb.png")
    _breakdown_plot([("ws", w) for w in ws] + [("rates", w) for w in r.get("rates", [])], out / "delivery_breakdown.png")
    paced = [x for x in r.get("replay", []) if x["rate"] != "max"]
    if paced:
        rates = [x["messages_per_s"] for x in paced]
        ax = _latency_plot(rates, paced, (("oplog_to_socket_ms", "oplog → socket (daemon)", "o"),
                                          ("e2e_ms", "replay → client (e2e)", "s")))
        ax.axhline(5, color="grey", lw=0.8, ls=":", label="5 ms target (p99, oplog → socket)")
        _finish(ax, "messages/s delivered",
                f"Latency vs message rate, {paced[0]['clients']} clients, replayed oplog (no database)",
                out / "latency_vs_rate.png")
    plt.close("all")
