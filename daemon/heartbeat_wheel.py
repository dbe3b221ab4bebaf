"""Due-time buckets for the heartbeat: a tick visits only the WebSockets
whose token expiry, ping or pong deadline has come, not all of them.

Visiting every WebSocket every tick cost about 1 us per socket per second:
0.79 of 2 cores for 760,000 idle sockets, the wall that kept a box from a
million (docs/decisions/million-connections.md). An idle socket is due about
once per ping interval, so the wheel visits each some 20 times less often.

Lazy by design: an item is in the wheel once, at the due time it had when it
was last visited. Whatever moves that time later (a pong) needs no wheel
operation: when the old time comes, the visit finds nothing to do and the
caller schedules the item again at its new due time. Whatever ends an item
(a close) needs none either: the caller drops it when it comes out. Nothing
may move a due time earlier without scheduling it again.

For a million items, nothing per item but its slot in a list: buckets keyed
by ``floor(due / resolution)``, and a heap of the bucket keys in use. Pure:
no clock, no I/O; the caller passes the time.
"""

from __future__ import annotations

import heapq
import math
from typing import Generic, TypeVar

T = TypeVar("T")


class DueWheel(Generic[T]):
    """Items by due time, ``resolution`` seconds to a bucket."""

    __slots__ = ("resolution", "_buckets", "_keys", "_count")

    def __init__(self, resolution: float):
        if not resolution > 0:
            raise ValueError(f"resolution must be positive, not {resolution}")
        self.resolution = resolution
        self._buckets: dict[int, list[T]] = {}
        self._keys: list[int] = []  # a heap of the keys of self._buckets
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def schedule(self, item: T, due: float) -> None:
        """Puts ``item`` in at ``due`` (finite; a past time comes out at the next ``pop_due``)."""
        key = math.floor(due / self.resolution)
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [item]
            heapq.heappush(self._keys, key)
        else:
            bucket.append(item)
        self._count += 1

    def pop_due(self, now: float) -> list[T]:
        """Takes out every item whose bucket is at or before ``now``'s, in due
        order by bucket and scheduling order within one. An item can come out
        up to ``resolution`` before its due time (the caller finds nothing due,
        and schedules it again), never after ``now`` has reached it."""
        last, keys, buckets = math.floor(now / self.resolution), self._keys, self._buckets
        due: list[T] = []
        while keys and keys[0] <= last:
            due.extend(buckets.pop(heapq.heappop(keys)))
        self._count -= len(due)
        return due
