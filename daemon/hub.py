"""Who gets what: the map from users to open connections. No ``await``.

The stream hands each message here once; ``dispatch`` returns nothing and
queues the already-encoded frame on every connection of the recipient and
of the sender (their other devices). A connection that is still catching up
keeps live frames in its queue until its catch-up frames are put in front.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from enum import Enum

from chat.messages import Message


class CloseReason(Enum):
    SLOW_CONSUMER = 4008


class Subscriber:
    """One connection's delivery state. The I/O shell drains ``queue``."""

    __slots__ = ("user", "queue", "last_id", "live", "overflowed", "_wake", "__weakref__")

    # queue items: (message id, JSON text, perf_counter when the oplog entry
    # arrived, or None for catch-up frames) - the last feeds the latency metric.

    def __init__(self, user: str, wake: Callable[[], None], since: int):
        self.user = user
        self.queue: deque[tuple[int, str, float | None]] = deque()
        self.last_id = since  # never send an id <= last_id: the per-connection dedup
        self.live = False  # False while catching up: live frames wait behind catch-up
        self.overflowed = False
        self._wake = wake

    def offer(self, msg_id: int, frame: str, received: float | None, limit: int) -> None:
        if self.overflowed:
            return
        if len(self.queue) >= limit:
            self.overflowed = True  # the shell closes with 4008; the client resumes with since
            self._wake()
            return
        self.queue.append((msg_id, frame, received))
        if self.live:
            self._wake()

    def go_live(self, catch_up: list[tuple[int, str, float | None]]) -> None:
        """Puts catch-up frames (ids <= the stream position at register time)
        in front of the live frames queued meanwhile, and starts sending."""
        self.queue.extendleft(reversed(catch_up))
        self.live = True
        self._wake()

    def take(self) -> list[tuple[int, str, float | None]]:
        """Frames to send now, oldest first, repeats dropped."""
        out = []
        while self.queue:
            item = self.queue.popleft()
            if item[0] > self.last_id:
                self.last_id = item[0]
                out.append(item)
        return out


class Hub:
    def __init__(self, send_queue_max: int):
        self._by_user: dict[str, set[Subscriber]] = {}
        self._limit = send_queue_max
        self.count = 0

    def register(self, sub: Subscriber) -> None:
        self._by_user.setdefault(sub.user, set()).add(sub)
        self.count += 1

    def unregister(self, sub: Subscriber) -> None:
        subs = self._by_user.get(sub.user)
        if subs and sub in subs:
            subs.discard(sub)
            self.count -= 1
            if not subs:
                del self._by_user[sub.user]

    def connections_of(self, user: str) -> int:
        return len(self._by_user.get(user, ()))

    def dispatch(self, msg: Message, frame: str, received: float | None = None) -> int:
        """Queues ``frame`` for the recipient's and the sender's connections; returns how many."""
        targets = self._by_user.get(msg.recipient, set())
        if msg.sender != msg.recipient and msg.sender in self._by_user:
            targets = targets | self._by_user[msg.sender]
        for sub in targets:
            sub.offer(msg.id, frame, received, self._limit)
        return len(targets)
