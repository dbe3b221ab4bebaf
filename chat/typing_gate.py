"""The typing throttle (docs/presence.md), shared by the daemons (per
connection, keyed by peer) and the API processes (per process, keyed by user
and peer). Pure: time comes in as an argument."""

from __future__ import annotations

from collections.abc import Hashable

TYPING_REFRESH_SECONDS = 1.0  # a `start` to one peer passes at most once per this


class TypingGate:
    """A `start` passes once a second per key, a `stop` always (and makes the next `start` news).
    It remembers at most ``most`` keys: past it, the one least recently started is forgotten."""

    __slots__ = ("last", "most")

    def __init__(self, most: int) -> None:
        self.last: dict[Hashable, float] = {}
        self.most = most

    def passes(self, key: Hashable, state: str, now: float) -> bool:
        last = self.last
        if state == "stop":
            last.pop(key, None)
            return True
        previous = last.pop(key, None)
        if previous is not None and now - previous < TYPING_REFRESH_SECONDS:
            last[key] = previous  # dropped: the window still runs from the one that passed
            return False
        if len(last) >= self.most:
            del last[next(iter(last))]
        last[key] = now
        return True
