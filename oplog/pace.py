"""How long a polled tail (FerretDB's: no awaitData) waits before its next ``getMore``.

While entries come, every ``base`` seconds (``CHAT_FERRETDB_TAIL_POLL_MS``).
After ``patience`` empty polls in a row (about a second of quiet), the wait
doubles at each empty poll up to ``idle_max`` (``CHAT_FERRETDB_TAIL_IDLE_POLL_MS``):
each poll makes FerretDB re-read the oplog, and an idle stack should cost
nothing. A poll that finds entries puts the pace back at ``base``, and so does a
wake (the writer's, through Redis: ``oplog.wake``), which also cuts the wait
under way short if it was a backoff's. A wake during the ``base`` pace changes
nothing: under traffic the tail polls as it always did.

No clock and no I/O: the decisions alone, which the tail (``oplog.tail``) acts on.
"""

from __future__ import annotations

IDLE_AFTER_SECONDS = 1.0  # quiet at the base pace before the polls back off


class PollPace:
    def __init__(self, base: float, idle_max: float, patience: int | None = None):
        """``patience``: empty polls at ``base`` before backing off (default: ``IDLE_AFTER_SECONDS`` of them)."""
        if base <= 0:
            raise ValueError("a polled tail needs a positive poll period")
        self.base = base
        self.idle_max = max(idle_max, base)
        self.patience = max(1, round(IDLE_AFTER_SECONDS / base)) if patience is None else patience
        self.empty = 0  # empty polls in a row
        self.delay = base  # the wait before the next poll

    @property
    def backing_off(self) -> bool:
        """The wait under way is longer than the base pace: a wake cuts it short."""
        return self.delay > self.base

    def polled(self, got_entries: bool) -> float:
        """The wait before the next poll, after one that found entries or none."""
        if got_entries:
            self.empty, self.delay = 0, self.base
        else:
            self.empty += 1
            if self.empty > self.patience:
                self.delay = min(self.idle_max, self.delay * 2)
        return self.delay

    def woken(self) -> bool:
        """A write committed: the pace is back at ``base``. True if that cut a backoff
        short (the tail polls at once); False if it was at the base pace already."""
        cut_short = self.backing_off
        self.empty, self.delay = 0, self.base
        return cut_short
