"""What a result was measured on: date, commit, cores, RAM, backing servers."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess

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
