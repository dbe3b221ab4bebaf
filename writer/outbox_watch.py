"""How big and how old the writer's outbox is: committed messages that the
fast store does not hold yet. Pure: the writer tells it what it sees, with
the time, and gets back whether to log.

An outbox normally lives for one failed insert and is copied by the next
turn. One that stays means the daemons learn of those messages only from
MySQL (their gap check), and that something keeps the copy from finishing:
an operator must hear of it, by a gauge and by a log line that repeats
while it lasts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

LOUD_AFTER_SECONDS = 10.0  # older than this: logged as an error, every LOUD_AFTER_SECONDS


@dataclass
class OutboxWatch:
    size: int = 0  # messages committed and not known to be in the fast store
    oldest: datetime | None = None  # created_at of the oldest of them, once known
    _logged_at: float = float("-inf")  # time.monotonic() of the last loud line

    def seen(self, size: int, oldest: datetime | None = None) -> None:
        """The outbox holds ``size`` messages; ``oldest``: the created_at of the
        first of them, when the caller read it (None keeps what is known)."""
        self.size = max(0, size)
        if oldest is not None:
            self.oldest = oldest
        if self.size == 0:
            self.oldest = None

    def cleared(self) -> None:
        self.seen(0)

    def age(self, now: datetime) -> float:
        """Seconds since the oldest message in the outbox was created; 0 when empty or unknown."""
        if not self.size or self.oldest is None:
            return 0.0
        return max(0.0, (now - self.oldest).total_seconds())

    def due_loud(self, now: datetime, monotonic: float) -> bool:
        """Whether to log the outbox as an error now: it is older than
        LOUD_AFTER_SECONDS, and the last such line is at least that old."""
        if self.age(now) < LOUD_AFTER_SECONDS or monotonic - self._logged_at < LOUD_AFTER_SECONDS:
            return False
        self._logged_at = monotonic
        return True
