"""``python -m cluster up`` (make cluster) and ``python -m cluster down`` (make cluster-down)."""

from __future__ import annotations

import logging
import time

import typer

from cluster import netns
from cluster.plan import PlanError, make_plan

app = typer.Typer(add_completion=False, no_args_is_help=True)


@app.command()
def up(hosts: int = typer.Option(3, help="application hosts (3 or more)"),
       daemons: int = typer.Option(2, help="daemon processes per host"),
       subnet: str = typer.Option("10.213.0.0/24", help="the cluster's network, inside 10.0.0.0/8 or 172.16.0.0/12"),
       partitions: int = typer.Option(0, help="CHAT_PARTITIONS for the hosts; 0: today's unpartitioned settings"),
       rtt_ms: float = typer.Option(0.0, help="round trip added to every host-database link (Toxiproxy)"),
       hours: float = typer.Option(12.0, help="stops by itself after this long")) -> None:
    """Builds the cluster, prints how to reach it, and keeps it up until Ctrl-C; then removes everything."""
    from cluster.up import Cluster, stop_on_sigterm

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per readiness probe otherwise
    netns.require_root()
    try:
        plan = make_plan(hosts, subnet, daemons)
    except PlanError as exc:
        raise SystemExit(f"cluster: {exc}") from None
    stop_on_sigterm()
    try:
        with Cluster(plan) as cluster:
            cluster.set_rtt(rtt_ms)
            cluster.start_hosts(partitions or None)
            print(cluster.banner(), flush=True)
            deadline = time.monotonic() + hours * 3600
            while time.monotonic() < deadline:
                time.sleep(1)
    except KeyboardInterrupt:
        print("\ncluster: stopped; every process, namespace and veth removed")


@app.command()
def down() -> None:
    """Removes what a crashed run left: processes in chat-* namespaces, the namespaces, veths, the bridge."""
    netns.require_root()
    removed = netns.teardown()
    print(f"cluster-down: removed {', '.join(removed)}" if removed else "cluster-down: nothing to remove")


if __name__ == "__main__":
    app()
