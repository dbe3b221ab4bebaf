"""The cluster's processes by role, and the CPU time they used (from /proc/<pid>/stat)."""

from __future__ import annotations

import os
from pathlib import Path

ROLES = ("api", "writer", "relay", "daemon", "mysql", "ferretdb", "redis", "toxiproxy", "nginx")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def role_of(cmdline: list[str]) -> str | None:
    """The role of a process from its argv, or None (supervisord, a shell, ...)."""
    if not cmdline:
        return None
    exe = Path(cmdline[0]).name
    if exe.startswith("python") and len(cmdline) >= 3 and cmdline[1] == "-m":
        module = cmdline[2]
        return module if module in ("api", "writer", "relay", "daemon") else None
    if exe in ("mariadbd", "mysqld"):
        return "mysql"
    if exe == "ferretdb":
        return "ferretdb"
    if exe.startswith("redis-server"):  # it rewrites its title: "/usr/bin/redis-server 10.213.0.2:6379"
        return "redis"
    if exe == "toxiproxy-server":
        return "toxiproxy"
    if exe == "nginx" or exe.startswith("nginx:"):
        return "nginx"
    return None


def cpu_ticks_from_stat(stat: str) -> int:
    """utime + stime (fields 14 and 15) of a /proc/<pid>/stat line; the command may hold spaces and parentheses."""
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def read_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def cpu_seconds(pid: int) -> float | None:
    try:
        return cpu_ticks_from_stat(Path(f"/proc/{pid}/stat").read_text()) / CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None


def snapshot(pids: list[int]) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) for the pids that have a role."""
    out = {}
    for pid in pids:
        role = role_of(read_cmdline(pid))
        if role is None:
            continue
        seconds = cpu_seconds(pid)
        if seconds is not None:
            out[pid] = (role, seconds)
    return out


def cpu_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role between two snapshots. A process that started in
    between counts from 0; one that ended counts up to its last snapshot."""
    used = dict.fromkeys(ROLES, 0.0)
    for pid, (role, seconds) in after.items():
        start = before.get(pid)
        used[role] += seconds - (start[1] if start and start[0] == role else 0.0)
    return used
