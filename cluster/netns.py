"""The namespaces, veth pairs and bridge of a plan: created, and removed with everything running in them.

Every step shells out to iproute2 (`ip`), as root. Removal is idempotent and
only touches names this package gives (chat-db, chat-edge, chat-h<N>, the
bridge chatbr0, veths chv-*), so it can clean up after a crashed run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time

from cluster.plan import BRIDGE, NAMESPACE_PATTERN, VETH_PREFIX, Plan, overlaps

log = logging.getLogger("chat.cluster")


class NotRoot(SystemExit):
    pass


def require_root() -> None:
    if os.geteuid() != 0:
        raise NotRoot("cluster: network namespaces, veths and bridges need root: run this as root (sudo make cluster)")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def existing_namespaces() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def ours(namespaces: list[str]) -> list[str]:
    return [ns for ns in namespaces if NAMESPACE_PATTERN.match(ns)]


def pids_in(namespace: str) -> list[int]:
    out = ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_all_in(namespace: str, sig: int = signal.SIGKILL, wait: float = 10.0) -> int:
    """Sends ``sig`` to every process in the namespace and waits (bounded) until they are gone."""
    pids = pids_in(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + wait
    while pids_in(namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


def teardown() -> list[str]:
    """Removes every namespace, veth and bridge of ours (and kills what runs inside). Idempotent."""
    removed = []
    for ns in ours(existing_namespaces()):
        kill_all_in(ns)
        ip("netns", "delete", ns, check=False)
        removed.append(ns)
    links = ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(VETH_PREFIX) or name == BRIDGE:
            ip("link", "delete", name, check=False)
            removed.append(name)
    return removed


def build(plan: Plan) -> None:
    """Bridge with the plan's first address, a namespace per member, a veth from each to the bridge."""
    routes = [line.split()[0] for line in ip("-4", "route", "show").stdout.splitlines() if line.strip()]
    clash = overlaps(plan, routes)
    if clash:
        raise RuntimeError(f"subnet {plan.subnet} overlaps networks routed here: {clash}; pick another (--subnet)")
    ip("link", "add", BRIDGE, "type", "bridge")
    ip("addr", "add", f"{plan.bridge_address}/{plan.prefix_len}", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")
    for m in plan.members:
        inside = f"{m.veth}-i"
        ip("netns", "add", m.namespace)
        ip("link", "add", m.veth, "type", "veth", "peer", "name", inside)
        ip("link", "set", m.veth, "master", BRIDGE)
        ip("link", "set", m.veth, "up")
        ip("link", "set", inside, "netns", m.namespace)
        ip("-n", m.namespace, "link", "set", inside, "name", "eth0")
        ip("-n", m.namespace, "addr", "add", f"{m.address}/{plan.prefix_len}", "dev", "eth0")
        ip("-n", m.namespace, "link", "set", "eth0", "up")
        ip("-n", m.namespace, "link", "set", "lo", "up")
    log.info("event=cluster_network subnet=%s namespaces=%s", plan.subnet, ",".join(plan.namespaces))


def in_namespace(namespace: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", namespace, *argv]
