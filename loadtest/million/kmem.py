"""Where the memory of many connections goes: the kernel's (/proc/meminfo,
/proc/slabinfo), our processes' (PSS), and the figures per connection.
Parsing and arithmetic are pure; ``sample`` is the one reader."""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

# The slab caches an idle loopback TCP connection and its epoll entry live in
SOCKET_CACHES = ("TCP", "sock_inode_cache", "dentry", "filp", "eventpoll_epi", "eventpoll_pwq",
                 "skbuff_head_cache", "kmalloc-1k", "kmalloc-512", "kmalloc-256", "kmalloc-192",
                 "kmalloc-64", "kmalloc-32", "request_sock_TCP", "tw_sock_TCP")
MEMINFO_KEYS = ("MemTotal", "MemAvailable", "MemFree", "Slab", "SReclaimable", "SUnreclaim", "KernelStack",
                "PageTables")


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes, the keys that matter here."""
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in MEMINFO_KEYS:
            out[name] = int(rest.split()[0]) * 1024
    return out


def parse_slabinfo(text: str) -> dict[str, int]:
    """Bytes held by each slab cache (active objects times their size)."""
    out = {}
    for line in text.splitlines()[2:]:
        fields = line.split()
        if len(fields) > 3:
            out[fields[0]] = int(fields[1]) * int(fields[3])
    return out


def parse_tcp_pages(sockstat: str) -> int:
    """Pages the kernel holds for TCP buffers (/proc/net/sockstat's TCP `mem`)."""
    for line in sockstat.splitlines():
        if line.startswith("TCP:"):
            fields = line.split()
            return int(fields[fields.index("mem") + 1])
    return 0


def sample() -> dict:
    meminfo = parse_meminfo(Path("/proc/meminfo").read_text())
    meminfo["TcpBuffers"] = parse_tcp_pages(Path("/proc/net/sockstat").read_text()) * 4096
    slabs: dict[str, int] = {}
    with contextlib.suppress(OSError):  # root only
        slabs = parse_slabinfo(Path("/proc/slabinfo").read_text())
    return {"meminfo": meminfo, "slabs": {k: slabs[k] for k in SOCKET_CACHES if k in slabs}}


def per_socket(before: dict, after: dict, sockets: int) -> dict[str, float | dict[str, float]]:
    """Kernel bytes per socket between two samples: Slab and SUnreclaim from
    meminfo, and each socket cache from slabinfo (KB, both ends counted)."""
    if sockets <= 0:
        return {}

    def kb(delta: int) -> float:
        return round(delta / sockets / 1024, 2)

    out: dict[str, float | dict[str, float]] = {
        k: kb(after["meminfo"][k] - before["meminfo"][k]) for k in ("Slab", "SUnreclaim", "PageTables", "TcpBuffers")}
    out["caches"] = {k: kb(after["slabs"][k] - before["slabs"].get(k, 0)) for k in after["slabs"]
                     if abs(after["slabs"][k] - before["slabs"].get(k, 0)) > 1024 * 1024}
    return out


def gib(n: int | float) -> float:
    return round(n / 2**30, 2)


def plot(steps: list[dict], path: Path, where: str) -> None:
    """Memory (kernel slab, daemons, load clients, what is left) against connections held."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    held = [s["held"] / 1000 for s in steps]
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, label in (("slab_gib", "kernel slab"), ("daemons_gib", "daemons (PSS)"),
                       ("clients_gib", "load clients (PSS)"), ("available_gib", "MemAvailable")):
        ax.plot(held, [s[key] for s in steps], marker="o", label=label)
    ax.set_xlabel("WebSocket connections held (thousands)")
    ax.set_ylabel("GiB")
    ax.set_title("Memory vs connections held\n" + "\n".join(textwrap.wrap(where, 90)), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
