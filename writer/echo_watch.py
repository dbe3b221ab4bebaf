"""A leading writer's watch on the copies owed to its partition.

With writes led per partition (``CHAT_WRITER_LEADS``, the proxy sending
partition k's requests to one host first), one writer takes nearly every turn
of k's lock. The copies that other partitions' originals owe k are its to make
too: a writer of another host that took k's lock for them stopped the
leader's turn, and the leader's next turn waited for it, two hand-overs for
each copy. The echo rows that those originals' commits write are the
hand-over instead. The watch reads them every ``interval`` seconds, without
the lock and writing nothing, and offers each new one to its writer's queue,
as a copy committed on this host is offered: a lingering turn takes it with
its next batch, an idle writer starts a turn for it. A wake (``wake()``, the
owing commit's message through Redis: ``writer.echo_wake``) cuts the pause
short, so a copy waits a round trip rather than half the period. Whatever it misses (the
leader away, its MySQL link cut) is drained by the next turn of any writer
of the partition, at its start, an idle one's within a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from chat.partitions import LiveMap, SlotMap
from db.threads import Threads
from writer import echo_sql
from writer.copies import Copy, Offers

log = logging.getLogger("chat.writer")


class EchoWatch:
    """Reads the echoes owed to ``partition`` every ``interval`` seconds (up to
    ``limit`` at a time) and ``offer``s each new copy (``copies.Offers``)."""

    def __init__(self, engine: Engine, *, partition: int, live: LiveMap, offer: Callable[[Copy], None],
                 interval: float, limit: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self._engine = engine
        self._partition = partition
        self._live = live
        self._offer = offer
        self._interval = interval
        self._limit = limit
        self._clock, self._sleep = clock, sleep
        self._offers = Offers()
        self._woken = asyncio.Event()
        self._conn: Connection | None = None  # kept open between reads: a checkout pings
        self._failing = False
        # A thread of its own: a read never waits behind a turn's statements, nor they behind it.
        self._threads = Threads(1, f"echo-watch-{partition}")

    async def run(self) -> None:
        while True:
            await self._pause()
            slot_map = self._live.current
            if slot_map.partitions == 1:
                continue  # one partition owes itself nothing
            try:
                owed, complete = await self._threads.run(self._read, slot_map)
            except SQLAlchemyError as exc:
                if not self._failing:  # once per outage, not every read
                    log.warning("event=echo_watch_failed partition=%d error=%s meaning=copies_owed_here_wait_for_"
                                "a_turn_s_drain", self._partition, exc.__class__.__name__)
                self._failing = True
                continue
            if self._failing:
                log.warning("event=echo_watch_resumed partition=%d", self._partition)
                self._failing = False
            for copy in self._offers.fresh(owed, complete, self._clock()):
                self._offer(copy)

    def wake(self) -> None:
        """A commit elsewhere left echoes for this partition: read them now, not at the period's end."""
        self._woken.set()

    async def _pause(self) -> None:
        """The period, or less if woken meanwhile; a wake during a read makes another read at once."""
        if not self._woken.is_set():
            period = asyncio.ensure_future(self._sleep(self._interval))
            woken = asyncio.ensure_future(self._woken.wait())
            try:
                done, _ = await asyncio.wait((period, woken), return_when=asyncio.FIRST_COMPLETED)
            except BaseException:  # this task cancelled meanwhile
                period.cancel()
                woken.cancel()
                raise
            woken.cancel()
            if period in done:
                period.result()  # what the sleep itself raised, if anything (a test's end of the watch)
            else:
                period.cancel()
        self._woken.clear()

    def _read(self, slot_map: SlotMap) -> tuple[list[Copy], bool]:
        try:
            if self._conn is None:
                # Each statement its own transaction: a read that mostly finds nothing is one round trip.
                self._conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            return echo_sql.owed_now(self._conn, self._partition, self._limit, slot_map)
        except SQLAlchemyError:
            self._drop()
            raise

    def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except SQLAlchemyError:
                pass  # a connection already lost: the pool replaces it

    def close(self) -> None:
        """At the writer's end, its task cancelled: the connection is closed after any read under way."""
        self._threads.close(last=self._drop)
