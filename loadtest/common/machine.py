"""What a result was measured on (date, commit, cores, RAM, backing servers), and how busy the CPUs were."""

from __future__ import annotations

import datetime
import os
import platform
import resource
import subprocess
import time
from collections.abc import Iterable

import psutil


def describe() -> dict:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            return "?"

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": sh("git rev-parse --short HEAD") + (" (dirty)" if sh("git status --porcelain") else ""),
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "mongo": "FerretDB 1.24 (SQLite backend), not MongoDB",
        "mysql": sh("mariadbd --version | sed 's/.*Ver //; s/ for.*//'") or "MariaDB",
    }


class CpuWindow:
    """How the machine's CPUs spent a window of time. ``steal`` is time the
    hypervisor gave to other guests while this one had work: a p99 measured
    while the host stole a third of the CPU says little about the code, so each
    latency run reports it beside its figures."""

    def __init__(self) -> None:
        self._start = psutil.cpu_times()

    def result(self) -> dict:
        end = psutil.cpu_times()
        delta = {f: getattr(end, f) - getattr(self._start, f) for f in end._fields}
        # guest time is already counted in user time on Linux
        total = sum(v for f, v in delta.items() if not f.startswith("guest")) or 1.0
        idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0)
        steal = delta.get("steal", 0.0)
        return {"steal_pct": round(100 * steal / total, 1), "busy_pct": round(100 * (total - idle - steal) / total, 1)}


def pid_of(proc: subprocess.Popen | None) -> int:
    """The process id of a server that runs (a ``harness.servers`` server's ``proc``: None until it starts)."""
    if proc is None:
        raise RuntimeError("the server has not been started")
    return proc.pid


def own_cpu_seconds() -> float:
    """User and system CPU seconds this process (every thread of it) used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    """User and system CPU seconds the processes used so far; one that is gone counts nothing
    (a sampler outlives some of what it watches)."""
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


class ProcessCpu:
    """CPU time that some processes (and their threads) used over a window."""

    def __init__(self, pids: list[int]) -> None:
        self._procs = [psutil.Process(pid) for pid in pids]
        self._start, self._at = self._used(), time.monotonic()

    def _used(self) -> float:
        return sum(t.user + t.system for t in (p.cpu_times() for p in self._procs))

    def seconds(self) -> float:
        return self._used() - self._start

    def cores(self) -> float:
        """Average cores busy since the window opened."""
        return round(self.seconds() / (time.monotonic() - self._at), 2)

