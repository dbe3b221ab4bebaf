"""Reads one histogram from every daemon behind the shared port (each answers
with its own pid label) and merges them; or from one process on a port of its
own (the writer's), with ``daemons=1``."""

from __future__ import annotations

import re

import httpx

# name_bucket{[other labels,]le="bound"} count
BUCKET = re.compile(r'^(\w+)_bucket\{(?:([^}]*),)?le="([^"]+)"\} ([\d.e+-]+)$', re.M)
PID = re.compile(r'chat_daemon_info\{pid="(\d+)"\}')


def histograms(url: str, name: str, daemons: int, tries: int = 60, labels: str = "") -> dict[str, dict[float, float]]:
    """pid -> {upper bound: cumulative count} for histogram `name`; ``labels``
    picks one child of a labelled one, as written before ``le`` (``generation="2"``)."""
    seen: dict[str, dict[float, float]] = {}
    for _ in range(tries):
        try:
            with httpx.Client(timeout=30) as c:  # a new connection: SO_REUSEPORT picks a daemon
                text = c.get(url, headers={"Connection": "close"}).text
        except httpx.HTTPError:
            continue  # a daemon busy past the timeout: its figures are left out
        pid = found.group(1) if (found := PID.search(text)) else url  # a process alone on its port
        seen[pid] = {float(le): float(v) for n, other, le, v in BUCKET.findall(text)
                     if n == name and other == labels}
        if len(seen) >= daemons:
            break
    return seen


def merged_delta(before: dict, after: dict) -> dict[float, float]:
    total: dict[float, float] = {}
    for pid, buckets in after.items():
        for le, v in buckets.items():
            total[le] = total.get(le, 0.0) + v - before.get(pid, {}).get(le, 0.0)
    return total


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """Upper bound of the bucket holding quantile q (Prometheus-style, coarse)."""
    if not buckets or buckets.get(float("inf"), 0) <= 0:
        return None
    total = buckets[float("inf")]
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return le
    return None


def quantile_interpolated(buckets: dict[float, float], q: float) -> float | None:
    """Quantile q interpolated linearly inside its bucket, as Prometheus's
    histogram_quantile does: finer than a bucket bound where buckets are wide."""
    if not buckets or buckets.get(float("inf"), 0) <= 0:
        return None
    rank, lower, below = q * buckets[float("inf")], 0.0, 0.0
    for le in sorted(buckets):
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * ((rank - below) / max(buckets[le] - below, 1e-12))
        lower, below = le, buckets[le]
    return None
