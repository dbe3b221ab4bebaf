"""`make bench-cluster`: the cluster of cluster/ under one-to-one traffic through
nginx, for P = 1, 2, 4 partitions and today's global writer lock, then three
faults (a host killed, one host's MySQL link cut, one partition's writer
stalled). Every message is checked on every device of both users. Writes
loadtest/results/cluster-latest.json and cluster-latest.png; exits non-zero
if any run lost or duplicated a message. Bounded: a watchdog ends it (and
removes the cluster) past --budget seconds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import orjson
import typer
from sqlalchemy import Connection, create_engine, text

from chat.partitions import SlotMap
from cluster import netns, procs
from cluster.partitions import partition_of, writer_lock_names
from cluster.plan import DAEMON_METRICS_BASE, RELAY_METRICS_PORT, WRITER_METRICS_PORT, make_plan
from cluster.up import Cluster
from loadtest.cluster import figures as fig
from loadtest.cluster.grow import GrowFault, grow_figures, history_check
from loadtest.cluster.traffic import ClientJob, ClientDevice, Sent, client_process, send
from loadtest.common import machine
from loadtest.common.log_scan import tokens_in_logs
from loadtest.common.results import RESULTS

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

IDLE_SECONDS = 5.0  # the idle window before each run's traffic
GROW_AFTER_SECONDS = 10.0  # the grow scenario's mover starts this far into its traffic
AFTER_CUTOVER_SECONDS = 20.0  # and its traffic goes on this long past the cutover
WHERE = ("FerretDB 1.24 (SQLite) and MariaDB 10.11 in one network namespace, 3 application hosts and nginx in "
         "namespaces of their own, Toxiproxy on every host-database link; all on 2 shared cores")


@dataclass
class Traffic:
    users: int
    devices: int  # per user
    rate: float  # messages/s offered
    seconds: float
    settle: float = 15.0
    writes_led: bool = True  # POSTs carry the sender's ?partition= (partitioned runs)


@dataclass
class Fault:
    name: str
    start: Callable[[], None]
    stop: Callable[[], None] | None
    others: Callable[[Sent, fig.Attempt], bool]  # the traffic the fault should spare
    victim_host: str | None = None
    until: Callable[[], bool] | None = None  # ends the traffic before its seconds (a grow: once cut over)


def scrape(url: str, name: str) -> float | None:
    with contextlib.suppress(httpx.HTTPError):
        return fig.prometheus_value(httpx.get(url, timeout=3).text, name)
    return None


def counters(cluster: Cluster) -> tuple[dict[str, float | None], dict[str, float | None]]:
    daemons = {d.name: scrape(f"http://{d.address}:{DAEMON_METRICS_BASE + d.index}/metrics",
                              "chat_daemon_oplog_entries_total") for d in cluster.daemons}
    relays = {h.namespace: scrape(f"http://{h.address}:{RELAY_METRICS_PORT}/metrics", "chat_relay_entries_total")
              for h in cluster.plan.hosts}
    return daemons, relays


def histogram_totals(urls: list[str], name: str) -> tuple[float, float]:
    """A histogram's (sum of seconds, count) over every /metrics page of ``urls`` (one that does
    not answer adds nothing)."""
    total, count = 0.0, 0.0
    for url in urls:
        with contextlib.suppress(httpx.HTTPError):
            page = httpx.get(url, timeout=3).text
            total += fig.prometheus_value(page, f"{name}_sum")
            count += fig.prometheus_value(page, f"{name}_count")
    return total, count


def stage_histograms(cluster: Cluster) -> tuple[tuple[float, float], tuple[float, float]]:
    """The daemons' ``chat_daemon_oplog_to_socket_seconds`` (an entry in from the relay to its frames
    written) and the relays' ``chat_oplog_tail_getmore_seconds`` (a FerretDB poll), each summed."""
    daemons = [f"http://{d.address}:{DAEMON_METRICS_BASE + d.index}/metrics" for d in cluster.daemons]
    relays = [f"http://{h.address}:{RELAY_METRICS_PORT}/metrics" for h in cluster.plan.hosts]
    return (histogram_totals(daemons, "chat_daemon_oplog_to_socket_seconds"),
            histogram_totals(relays, "chat_oplog_tail_getmore_seconds"))


def writer_samples(cluster: Cluster) -> dict[str, float]:
    """Every host's writer's samples of ``fig.WRITER_SAMPLES``, summed over the hosts (a host whose
    writer does not answer adds nothing)."""
    total = dict.fromkeys(fig.WRITER_SAMPLES, 0.0)
    for host in cluster.plan.hosts:
        with contextlib.suppress(httpx.HTTPError):
            page = httpx.get(f"http://{host.address}:{WRITER_METRICS_PORT}/metrics", timeout=3).text
            for name in fig.WRITER_SAMPLES:
                total[name] += fig.prometheus_value(page, name)
    return total


def delta(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float]:
    return {k: now - then for k, now in after.items() if now is not None and (then := before.get(k)) is not None}


def run_traffic(cluster: Cluster, label: str, partitions: int, partitioned: bool, traffic: Traffic,
                fault: Fault | None = None, fault_at: float = 0.0, fault_for: float = 0.0) -> dict:
    users = [f"{label}-u{i}" for i in range(traffic.users)]
    # A client posts with the ?partition= it connects with, the edge's route to its partition's leading API.
    def route(user: str) -> int | None:
        return partition_of(user, partitions) if partitioned and traffic.writes_led else None

    devices = [ClientDevice(u, j, partition_of(u, partitions) if partitioned else None)
               for u in users for j in range(traffic.devices)]
    tmp = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    ctx = mp.get_context("spawn")
    connected, frames, stop = ctx.Value("i", 0), ctx.Value("l", 0), ctx.Event()
    job = ClientJob(devices, cluster.plan.edge.address, 80, cluster.secret, str(tmp / "clients.json"))
    client = ctx.Process(target=client_process, args=(job, connected, frames, stop), daemon=True)
    client.start()
    try:
        t0 = time.monotonic()
        while connected.value < len(devices) and time.monotonic() - t0 < 60:
            time.sleep(0.2)
        print(f"  {label}: {connected.value}/{len(devices)} devices connected in {time.monotonic() - t0:.1f} s",
              flush=True)
        # An idle window first: what each stage spends with no traffic (polls, checkpoints, a
        # partition's turns) is apart from what each message adds.
        idle_before, idle_at = procs.snapshot(cluster.host_pids()), time.monotonic()
        time.sleep(IDLE_SECONDS)
        idle = procs.cpu_by_role(idle_before, procs.snapshot(cluster.host_pids()))
        idle_seconds = time.monotonic() - idle_at
        cpu_before, (d_before, r_before) = procs.snapshot(cluster.host_pids()), counters(cluster)
        w_before, (stage_before, polls_before) = writer_samples(cluster), stage_histograms(cluster)
        started, busy_at = time.time(), time.monotonic()
        sent = asyncio.run(_send_with_fault(cluster, users, route, traffic, fault, fault_at, fault_for, frames))
        sent_end = time.time()
        want = sum(2 * traffic.devices for s in sent if s.msg_id is not None)
        last, still, hard = frames.value, time.monotonic(), time.monotonic() + 60
        while frames.value < want and time.monotonic() - still < traffic.settle and time.monotonic() < hard:
            time.sleep(0.2)
            if frames.value != last:
                last, still = frames.value, time.monotonic()
        cpu_after, (d_after, r_after) = procs.snapshot(cluster.host_pids()), counters(cluster)
        w_after, (stage_after, polls_after) = writer_samples(cluster), stage_histograms(cluster)
        busy_seconds = time.monotonic() - busy_at
    finally:
        stop.set()
        client.join(30)
        if client.is_alive():
            client.kill()
    data = orjson.loads(Path(job.out).read_bytes())
    delivery = fig.check_delivery(sent, devices, data["received"], data["duplicates"])
    stored = sum(s.msg_id is not None for s in sent)
    latencies = [lat for _, lat, _, _ in data["arrivals"]]
    host_of_daemon = {d.name: d.host for d in cluster.daemons}
    result = {
        "msgs_per_s": round(stored / (sent_end - started), 1), "offered_per_s": traffic.rate, "asked": len(sent),
        "stored": stored, "delivery_p50_ms": fig.percentile(latencies, 0.5),
        "delivery_p99_ms": fig.percentile(latencies, 0.99),
        "delivery_ms_by_path": fig.delivery_by_path(
            data["arrivals"], devices, lambda user: partition_of(user, partitions) if partitioned else 0),
        # the stages before the tail: a POST's answer (the MySQL commit), and the writers' turns
        "post_ms": fig.post_answer_ms(sent), "writers": fig.writer_stage(w_before, w_after, busy_seconds),
        # the daemons' stage: an entry in from the relay to its frames written, mean over the run
        "daemon_entry_to_socket_ms": fig.mean_between(stage_before, stage_after),
        # the relays' tails: how long a getMore took (on FerretDB, one poll), and how many a second, all relays
        "relay_getmore_ms": fig.mean_between(polls_before, polls_after),
        "relay_getmores_per_s": round((polls_after[1] - polls_before[1]) / busy_seconds, 1),
        "cpu_us_per_msg": fig.cpu_us_per_msg(procs.cpu_by_role(cpu_before, cpu_after), stored),
        "cpu_us_per_msg_past_idle": fig.marginal_cpu_us_per_msg(procs.cpu_by_role(cpu_before, cpu_after),
                                                                busy_seconds, idle, idle_seconds, stored),
        # Rows each stored message costs the writers: 1, plus a copy when its two users' partitions differ.
        "writes_per_msg": fig.writes_per_message(
            sent, lambda user: partition_of(user, partitions) if partitioned else 0),
        "daemon_decoded_share": list(fig.decoded_shares(delta(d_before, d_after), delta(r_before, r_after),
                                                        host_of_daemon).values()),
        "daemon_expected_share": list(fig.expected_shares(
            {d.name: d.partitions for d in cluster.daemons}, partitions if partitioned else 1).values()),
        "daemons": [d.name for d in cluster.daemons],
        "lost": delivery.lost, "duplicated": delivery.duplicated, "expected_deliveries": delivery.expected,
        "devices": len(devices), "reconnects": data["reconnects"], "connect_failures": data["failures"],
    }
    result["_sent"], result["_started"], result["_client"] = sent, started, data
    return result


async def _send_with_fault(cluster: Cluster, users: list[str], route: Callable[[str], int | None], traffic: Traffic,
                           fault: Fault | None, fault_at: float, fault_for: float,
                           frames: Synchronized[int]) -> list[Sent]:
    def tick(i: int) -> None:
        if i and i % int(traffic.rate * 5) == 0:
            print(f"    sent {i}, frames received {frames.value}", flush=True)

    sending = asyncio.create_task(send(cluster.plan.edge_url, cluster.secret, users, traffic.rate, traffic.seconds,
                                       tick=tick, until=None if fault is None else fault.until,
                                       partition_of=route))
    if fault is not None:
        await asyncio.sleep(fault_at)
        print(f"    fault on: {fault.name}", flush=True)
        await asyncio.to_thread(fault.start)
        await asyncio.sleep(fault_for)
        if fault.stop is not None:
            await asyncio.to_thread(fault.stop)
            print(f"    fault off: {fault.name}", flush=True)
    return await sending


class LockHolder:
    """Holds one partition's writer lock from a connection of its own (past Toxiproxy): that writer stalls.

    It first takes the lock's queue lock, as a writer waiting for its turn does, so
    the holder ends its turn after the batch in hand and the lock comes here."""

    def __init__(self, url: str, partition: int):
        self.lock, self.queue = writer_lock_names(partition)
        self._engine = create_engine(url)
        self._conn: Connection | None = None

    def start(self) -> None:
        self._conn = conn = self._engine.connect()
        assert conn.execute(text("SELECT GET_LOCK(:n, 30)"), {"n": self.queue}).scalar() == 1
        got = conn.execute(text("SELECT GET_LOCK(:n, 30)"), {"n": self.lock}).scalar()
        conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": self.queue})
        if got != 1:
            raise RuntimeError(f"could not take {self.lock} in 30 s")

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": self.lock})
            self._conn.close()
        self._engine.dispose()


def fault_figures(cluster: Cluster, run: dict, fault: Fault, fault_at: float, fault_for: float) -> dict:
    sent, started = run["_sent"], run["_started"]
    on, off = started + fault_at, started + fault_at + fault_for
    baseline = fig.accepted_per_s(sent, started + 2, on, fault.others)
    during = fig.accepted_per_s(sent, on + 1, off, fault.others)
    out = {"name": fault.name, "lost": run["lost"], "duplicated": run["duplicated"], "others_msgs_per_s": during,
           "baseline_msgs_per_s": baseline, "msgs_per_s_during_fault": fig.accepted_per_s(sent, on + 1, off),
           "fault_seconds": fault_for, "reconnects": run["reconnects"], "stored": run["stored"],
           "asked": run["asked"]}
    if fault.victim_host:
        addresses = {h.address: h.namespace for h in cluster.plan.hosts}
        refused = fig.answers(sent, on + 0.5, off, lambda a: a.status == 503
                              and fig.host_of(a.upstream, addresses) == fault.victim_host)
        out["victim_host"] = fault.victim_host
        out["victim_503s"] = len(refused)
        out["victim_503_p50_ms"] = fig.percentile([a.seconds for a in refused], 0.5)
        out["victim_503_p99_ms"] = fig.percentile([a.seconds for a in refused], 0.99)
    return out


def public(run: dict) -> dict:
    return {k: v for k, v in run.items() if not k.startswith("_")}


def main(hosts: int = typer.Option(3), rtt_ms: float = typer.Option(2.0, help="added host-database round trip"),
         users: int = typer.Option(750), devices: int = typer.Option(2, help="WebSocket devices per user"),
         rate: float = typer.Option(100.0, help="messages/s offered"), seconds: float = typer.Option(20.0),
         partitions: str = typer.Option("1,2,4"), faults: bool = typer.Option(True),
         fault_seconds: float = typer.Option(
             30.0, min=9.0, help="each fault run: a third before, two fifths under the fault (9 s at least: the "
             "rate before a fault is read from 2 s in, and during it from 1 s in)"),
         grow_to: int = typer.Option(8, help="the grow scenario: from the largest of --partitions to this many, "
                                     "online, under traffic (0: skip it)"),
         grow_users: int = typer.Option(200), grow_rate: float = typer.Option(50.0),
         grow_seconds: float = typer.Option(240.0, min=40.0, help="the grow scenario's traffic at most: the mover "
                                            "starts 10 s in, and the traffic ends 20 s after its cutover"),
         writes_led: bool = typer.Option(True, help="partitioned runs: each POST carries its sender's ?partition=, "
                                         "which the edge sends to that partition's leading host, whose writer makes "
                                         "the copies owed to it (--no-writes-led: any host, every writer)"),
         budget: float = typer.Option(720.0, help="seconds before the watchdog ends the bench"),
         setting: list[str] = typer.Option([], "--set", help="KEY=VALUE: a setting of every host's processes, kept "
                                           "in the result (e.g. CHAT_RELAY_ROUTE_BY_USER=false)"),
         out: Path = typer.Option(RESULTS / "cluster-latest.json")) -> None:
    netns.require_root()

    def watchdog(signum: int, frame: object) -> None:
        raise TimeoutError(f"cluster bench: past its {budget:.0f} s budget")
    signal.signal(signal.SIGALRM, watchdog)
    signal.alarm(int(budget))
    signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(KeyboardInterrupt()))
    began = time.monotonic()
    traffic = Traffic(users, devices, rate, seconds, writes_led=writes_led)
    plist = [int(p) for p in partitions.split(",")]
    plan = make_plan(hosts)
    result: dict = {"hosts": hosts, "where": WHERE, "rtt_ms": rtt_ms, "rtt_how": (
        f"Toxiproxy latency toxic of {rtt_ms:g} ms on every answer (downstream) of every host-MySQL and host-Mongo "
        "link: each round trip between a host and a database takes that much longer"),
        "traffic": {"users": users, "devices_per_user": devices, "clients": users * devices, "offered_per_s": rate,
                    "seconds": seconds, "writes_led": writes_led}, **machine.describe(), "runs": [], "faults": []}
    env = {"CHAT_RATE_LIMIT_PER_SECOND": "0", "CHAT_LOG_LEVEL": "WARNING", "CHAT_DRAIN_SECONDS": "0",
           **dict(kv.split("=", 1) for kv in setting)}
    result["env"] = env
    try:
        with Cluster(plan, extra_env=env, writes_led=writes_led) as cluster:
            cluster.set_rtt(rtt_ms)
            print(f"cluster up in {time.monotonic() - began:.0f} s: {hosts} hosts, rtt {rtt_ms:g} ms", flush=True)
            modes = [("global-lock", 1)] + [("partitioned", p) for p in plist]
            for n, (mode, p) in enumerate(modes):
                cluster.start_hosts(None if mode == "global-lock" else p)
                print(f"run {mode} P={p}", flush=True)
                run = run_traffic(cluster, f"r{n}", p, mode == "partitioned", traffic)
                result["runs"].append({"mode": mode, "partitions": p, "rtt_ms": rtt_ms, **public(run)})
                _print_run(result["runs"][-1])
                cluster.stop_hosts()
            if faults:
                result["faults"] = run_faults(cluster, max(plist), traffic, fault_seconds)
            if grow_to:
                result["grow"] = run_grow(cluster, max(plist), grow_to,
                                          Traffic(grow_users, devices, grow_rate, grow_seconds,
                                                  writes_led=writes_led))
            state = cluster.state
        # After the cluster stopped: every process has flushed its logs.
        result["tokens_in_logs"] = tokens_in_logs(state)
    finally:
        signal.alarm(0)
        result["seconds_total"] = round(time.monotonic() - began, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
        print(f"wrote {out}")
        if result["runs"]:
            from loadtest.cluster.plot import plot
            print(f"wrote {plot(result, out.with_suffix('.png'))}")
    bad = [r for r in result["runs"] + result["faults"] + ([result["grow"]] if "grow" in result else [])
           if r["lost"] or r["duplicated"] or r.get("unmoved_refused_posts") or r.get("mover_error")]
    if bad:
        raise SystemExit(f"FAILED: messages lost or duplicated in {len(bad)} run(s)")
    if result.get("tokens_in_logs"):
        raise SystemExit(f"FAILED: tokens in log files: {result['tokens_in_logs']}")
    print("no token in any log file of the run (nginx's included)")


def run_faults(cluster: Cluster, partitions: int, traffic: Traffic, seconds: float) -> list[dict]:
    victim = cluster.plan.hosts[0].namespace
    addresses = {h.address: h.namespace for h in cluster.plan.hosts}
    holder = LockHolder(cluster.admin_mysql_url, 0)
    assert cluster.toxiproxy
    toxi = cluster.toxiproxy
    link = cluster.plan.proxy(victim, "mysql").name

    def elsewhere(s: Sent, a: fig.Attempt) -> bool:
        return fig.host_of(a.upstream, addresses) != victim

    def other_partitions(s: Sent, a: fig.Attempt) -> bool:
        return partition_of(s.sender, partitions) != 0 and partition_of(s.recipient, partitions) != 0

    plan_faults = [
        Fault("mysql link cut", lambda: toxi.set_enabled(link, False), lambda: toxi.set_enabled(link, True),
              elsewhere, victim),
        Fault("partition stalled", holder.start, holder.stop, other_partitions),
        Fault("host killed", lambda: print(f"    killed {cluster.kill_host(victim)} processes of {victim}"),
              None, elsewhere),
    ]
    fault_traffic = dataclasses.replace(traffic, seconds=seconds)
    fault_at, fault_for = seconds / 3, seconds * 0.4
    cluster.start_hosts(partitions)
    results = []
    for n, fault in enumerate(plan_faults):
        print(f"fault {fault.name} (P={partitions})", flush=True)
        run = run_traffic(cluster, f"f{n}", partitions, True, fault_traffic, fault, fault_at, fault_for)
        figures = fault_figures(cluster, run, fault, fault_at, fault_for)
        results.append(figures)
        print(f"    {figures}", flush=True)
    cluster.stop_hosts()
    return results


def run_grow(cluster: Cluster, partitions: int, to: int, traffic: Traffic) -> dict:
    """From ``partitions`` to ``to`` with `chatctl partitions grow`, online, a quarter into the traffic."""
    before = SlotMap.even(partitions)
    mover = GrowFault(cluster, to, [])
    # The traffic goes on until 20 s past the cutover (the copy takes as long as the history is big:
    # every earlier run's users move too), at most ``traffic.seconds``.
    fault = Fault(f"grow {partitions} -> {to}", mover.start, None, lambda s, a: True,
                  until=lambda: (cut := mover.cut_over_at) is not None and time.time() > cut + AFTER_CUTOVER_SECONDS)
    cluster.start_hosts(partitions)
    print(f"grow {partitions} -> {to}, online", flush=True)
    run = run_traffic(cluster, "g", partitions, True, traffic, fault, GROW_AFTER_SECONDS, 0.0)
    mover.wait(120)
    after = before.grown(to)
    devices = [ClientDevice(f"g-u{i}", j, partition_of(f"g-u{i}", partitions))
               for i in range(traffic.users) for j in range(traffic.devices)]
    figures = {**grow_figures(run, devices, before, after, mover,
                              history_check(cluster.admin_mysql_url, run["_sent"], after)),
               "offered_per_s": traffic.rate, "msgs_per_s": run["msgs_per_s"],
               "seconds": round(run["_sent"][-1].at - run["_sent"][0].at, 1) if run["_sent"] else 0.0,
               "delivery_p50_ms": run["delivery_p50_ms"], "delivery_p99_ms": run["delivery_p99_ms"]}
    cluster.stop_hosts()
    print(f"    {figures}", flush=True)
    return figures


def _print_run(r: dict) -> None:
    cpu = ", ".join(f"{k} {v}" for k, v in r["cpu_us_per_msg"].items() if v)
    print(f"  {r['mode']} P={r['partitions']}: {r['msgs_per_s']} msg/s, delivery p50 {r['delivery_p50_ms']} ms "
          f"p99 {r['delivery_p99_ms']} ms, lost {r['lost']}, duplicated {r['duplicated']}; "
          f"decoded shares {r['daemon_decoded_share']}; CPU us/msg: {cpu}", flush=True)
    w = r["writers"]
    print(f"    POST answered p50/p99 {r['post_ms']['p50']}/{r['post_ms']['p99']} ms; writers: {w['turns_per_s']} "
          f"turns/s, {w['rows_per_commit']} rows a commit, lock waited {w['lock_wait_ms']} ms and held "
          f"{w['lock_hold_ms']} ms a turn, Mongo insert {w['mongo_lag_ms']} ms after the commit "
          f"({w['mongo_inserts_per_s']} inserts/s of {w['mongo_insert_ms']} ms)"
          + (f", a copy committed {w['copy_lag_ms']} ms after its original's stamp" if w["copy_lag_ms"] else ""),
          flush=True)


if __name__ == "__main__":
    typer.run(main)
