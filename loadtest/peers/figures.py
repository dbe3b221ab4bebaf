"""The figures of a peers run, from what the load clients received: pure, tested without I/O.

A run is a schedule of steps (a rate for some seconds); message ids run from 1
without a gap, step after step, and each id is for exactly one client. So
lost, duplicated and latency are counted per step from the ids alone, and the
rate a server sustains is the highest step whose p99 stays under the limit
with nothing lost, every step below it passing too (past the knee, a backlog
carries into the next step, so a later step can never pass again honestly).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of sorted values; None when there are none."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def per_step(ranges: list[tuple[int, int]], received: Iterable[tuple[Sequence[int], Sequence[float]]],
             copies: int = 1) -> list[dict]:
    """For each step's id range: delivered, lost, and latency p50/p99 (ms), from
    (ids, latencies) arrays as each client process kept them (first arrivals per
    device only); each message is owed to ``copies`` devices (its user's)."""
    firsts = [a for a, _ in ranges]
    got: list[list[float]] = [[] for _ in ranges]
    for ids, lats in received:
        for msg_id, lat in zip(ids, lats, strict=True):
            k = bisect_right(firsts, msg_id) - 1
            if k >= 0 and msg_id <= ranges[k][1]:
                got[k].append(lat)
    out = []
    for (first, last), lats in zip(ranges, got, strict=True):
        lats.sort()
        p50, p99 = quantile(lats, 0.5), quantile(lats, 0.99)
        owed = copies * (last - first + 1)
        out.append({"messages": last - first + 1, "frames": owed, "delivered": len(lats), "lost": owed - len(lats),
                    "p50_ms": None if p50 is None else round(p50, 1),
                    "p99_ms": None if p99 is None else round(p99, 1)})
    return out


def cpu_in(samples: list[tuple[float, dict[str, float]]], start: float, end: float) -> dict[str, float]:
    """CPU seconds each process group used between two wall-clock times, from
    cumulative samples (time, {group: seconds}) taken in order: the samples
    nearest inside the window bound it."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) < 2:
        return {}
    a, b = inside[0][1], inside[-1][1]
    return {k: round(b[k] - a.get(k, 0.0), 4) for k in b}


def sustained(steps: list[dict], p99_limit_ms: float = 100.0) -> tuple[float | None, float | None]:
    """(the highest rate whose step and every step below it passed, the first rate that failed):
    a step passes with every message delivered once, p99 under the limit, and its feed
    having offered at least 95 % of the rate (a feed that cannot keep up measures itself)."""
    best, knee = None, None
    for step in steps:
        ok = (step["lost"] == 0 and step.get("duplicated", 0) == 0 and step["p99_ms"] is not None
              and step["p99_ms"] < p99_limit_ms and step.get("offered_per_s", step["rate"]) >= 0.95 * step["rate"])
        if not ok:
            knee = step["rate"]
            break
        best = step["rate"]
    return best, knee


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 2) if ours and theirs else None


# The load clients run on the same cores as the server: past this share of the server's CPU
# per frame, what a step measures is as much the client as the server.
CLIENT_BOUND_SHARE = 0.5


def client_bound(cpu_us_per_frame: dict[str, float]) -> bool | None:
    """Whether the clients' CPU per frame is over ``CLIENT_BOUND_SHARE`` of the server's;
    None without both figures."""
    client, server = cpu_us_per_frame.get("clients"), cpu_us_per_frame.get("server")
    if not client or not server:
        return None
    return client > CLIENT_BOUND_SHARE * server


def client_cost(client: str, steps: list[dict], best: float | None, knee: float | None) -> dict:
    """The load client beside the server: both CPU per frame at the sustained rate, and whether
    the run was bound by the client there or at the knee (the step that failed may have failed
    for the client's want of CPU). Steps below them are not the rate's limit: at a low rate a
    wake-up carries fewer frames, and the client's share is higher where nothing is short."""
    measured = [s for s in steps if s["rate"] in (best, knee)]
    at_best = next((s for s in steps if s["rate"] == best), None)
    cpu = (at_best or {}).get("cpu_us_per_frame") or {}
    marks = [s.get("client_bound") for s in measured]
    return {"client": client, "client_cpu_us_per_frame": cpu.get("clients"),
            "server_cpu_us_per_frame": cpu.get("server"),
            "client_share_of_server": round(cpu["clients"] / cpu["server"], 2)
            if cpu.get("clients") and cpu.get("server") else None,
            "client_bound": True if any(marks) else (False if marks and None not in marks else None)}
