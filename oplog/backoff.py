"""Capped, jittered exponential backoff for retries against a store or a socket."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, base: float = 0.05, cap: float = 5.0):
        self.base, self.cap, self.attempt = base, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.base * 2 ** self.attempt)
        self.attempt += 1
        return delay * random.uniform(0.5, 1.0)  # jitter: daemons do not retry in lockstep

    def reset(self) -> None:
        self.attempt = 0
