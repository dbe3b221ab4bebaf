"""A turn's committed messages on their way to Mongo (``Mirror``, the pump).

One insert at a time, in id order, by one task (the pump) that runs while
anything is unsent: each insert takes everything committed since the previous
one started, and starts as soon as that one (and its pause, ``core.insert_gap``)
is done, whatever the turn is doing then. A MySQL commit (and its answers)
never waits for a Mongo insert unless ``unsent_max`` messages already do.
After a failed insert nothing more is inserted: the rows are the outbox,
copied in order later (docs/decisions/mongo-insert-pump.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from chat.messages import Message
from writer.core import insert_gap


class Mirror:
    def __init__(self, insert: Callable[[list[dict]], Awaitable[bool]], ok: bool, mirrored: int,
                 last_id: int, unsent_max: int, observe_lag: Callable[[float, int], None] = lambda s, n: None,
                 *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._insert = insert
        self._clock, self._sleep = clock, sleep  # the tests' fake clock and pause
        self.ok = ok  # every insert so far succeeded (and, at the start, Mongo held everything to last_id)
        self.mirrored = mirrored  # every id up to it is in Mongo
        self._last_id = last_id
        self._unsent: list[Message] = []
        # (created_at on ``clock``, messages) of each batch in _unsent: how long each took to reach Mongo
        self._unsent_commits: list[tuple[float, int]] = []
        self._unsent_max = unsent_max
        self._observe_lag = observe_lag
        self.inserting: asyncio.Task | None = None  # the pump
        self._room: asyncio.Future | None = None  # a commit waiting for the pump to take what is unsent

    async def add(self, new: list[Message], last_id: int, stamped: float) -> None:
        """Messages just committed, up to ``last_id``; ``stamped``: their created_at, on ``clock``."""
        self._unsent.extend(new)
        if new:
            self._unsent_commits.append((stamped, len(new)))
        self._last_id = last_id
        if self.inserting is None or self.inserting.done():
            await self.settle()
        elif len(self._unsent) >= self._unsent_max:
            # Mongo slower than MySQL for long: the writer slows down to it
            # rather than queue without end, until the pump takes these.
            self._room = asyncio.get_running_loop().create_future()
            await self._room

    async def settle(self) -> None:
        """Collects a pump that ended, then starts one if anything is unsent."""
        if self.inserting is not None:
            await self.inserting
            self.inserting = None
        if not self.ok:
            self._unsent, self._unsent_commits = [], []  # the outbox: the next turn copies them
        elif self._unsent:
            self.inserting = asyncio.create_task(self._pump())
        else:
            self.mirrored = self._last_id  # nothing in flight, nothing unsent, nothing failed

    async def drain(self) -> None:
        """Until Mongo holds every message committed, or an insert failed."""
        while self.inserting is not None:
            await self.settle()

    async def _pump(self) -> None:
        try:
            while self._unsent:
                docs = [m.to_doc() for m in self._unsent]
                commits, upto = self._unsent_commits, self._last_id
                self._unsent, self._unsent_commits = [], []
                self._make_room()
                if not await self._insert(docs):
                    self.ok = False
                    return
                self.mirrored = upto
                now = self._clock()
                for stamped, count in commits:  # weighted by messages: a quantile of messages, not of batches
                    self._observe_lag(now - stamped, count)
                if gap := insert_gap(len(self._unsent)):  # under a flood the next insert goes at once
                    await self._sleep(gap)
        finally:
            self._make_room()  # a commit never waits on a pump that has ended

    def _make_room(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)
        self._room = None
