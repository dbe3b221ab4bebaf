"""Per-sender token buckets, in memory, per API process. Pure."""

from __future__ import annotations

import time
from collections.abc import Callable


class RateLimiter:
    """``allow(user)`` returns 0.0 if the message may go, else seconds to wait.

    Buckets of idle senders are full, so forgetting them changes nothing:
    the table is trimmed to ``max_users`` that way and stays bounded.
    """

    def __init__(self, per_second: float, burst: int, max_users: int = 100_000,
                 clock: Callable[[], float] = time.monotonic):
        self._rate = per_second
        self._burst = float(burst)
        self._max_users = max_users
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # user -> (tokens, at)

    def allow(self, user: str) -> float:
        if self._rate <= 0:
            return 0.0
        now = self._clock()
        tokens, at = self._buckets.get(user, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if tokens < 1.0:
            self._buckets[user] = (tokens, now)
            return (1.0 - tokens) / self._rate
        if len(self._buckets) >= self._max_users and user not in self._buckets:
            self._forget_full(now)
        self._buckets[user] = (tokens - 1.0, now)
        return 0.0

    def _forget_full(self, now: float) -> None:
        refill = self._burst / self._rate
        self._buckets = {u: b for u, b in self._buckets.items() if now - b[1] < refill}
        if len(self._buckets) >= self._max_users:  # all busy: drop the oldest half
            keep = sorted(self._buckets.items(), key=lambda kv: kv[1][1])[len(self._buckets) // 2:]
            self._buckets = dict(keep)
