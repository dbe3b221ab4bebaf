"""How a turn waits while it holds the writer lock, and what it leaves in flight.

``TurnWaits`` is the part of a ``MessageWriter`` that waits: for requests to
form the next batch (``next_batch``, ``linger``) and for Mongo
(``under_lock``). Waiting on Mongo under the lock is what held every other
host's writes of the partition hostage when this host's Mongo hung: each
call waited out its timeout while the queued writers' lock wait, the same
timeout, ran out. So once another process is queued, a Mongo call is waited
for ``HANDOVER_GRACE_SECONDS`` at most (the decision is
``WriterCore.mongo_patience``); then it is left in flight, the turn commits
the batch in hand, ends and releases the lock, and what the call was to copy
is the outbox, which the next turn copies first. Why ids still reach Mongo
in id order: docs/design.md, section 1.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from writer.batch import Pending
from writer.core import WriterCore, batch_room
from writer.mirror import Mirror
from writer.mysql_steps import MySQLSteps

log = logging.getLogger("chat.writer")


class TurnWaits:
    """The waits of one partition's writer: on ``queue``, its requests (a batch
    of ``batch_max`` at most, gathered for ``window_ms``), and on Mongo under the lock."""

    def __init__(self, queue: asyncio.Queue[Pending], *, core: WriterCore, sql: MySQLSteps, partition: int,
                 batch_max: int, window_ms: float):
        self._queue = queue
        self._core = core
        self._sql = sql
        self._partition = partition
        self._batch_max = batch_max
        self._window = window_ms / 1000
        self._left: set[asyncio.Future] = set()  # Mongo work left in flight at a hand-over, referenced till it ends

    async def next_batch(self, first: Pending | None) -> list[Pending]:
        if first is None:
            if self._queue.empty():
                return []
            first = self._queue.get_nowait()
        if self._window:
            await asyncio.sleep(self._window)  # let concurrent requests join the batch
        batch = [first]
        for _ in range(batch_room(1, self._queue.qsize(), self._batch_max)):
            batch.append(self._queue.get_nowait())
        return batch

    def topped_up(self, batch: list[Pending]) -> list[Pending]:
        """``batch``, with the requests that queued while the turn waited for the
        lock, up to ``batch_max``, taken without waiting: they join this turn's
        first commit. Left in the queue, they waited for this host's next turn,
        after a whole round of the other hosts' turns, and a writer queued
        behind them waits most of its time for the lock."""
        for _ in range(batch_room(len(batch), self._queue.qsize(), self._batch_max)):
            batch.append(self._queue.get_nowait())
        return batch

    async def _request_or_done(self, inserting: asyncio.Task, timeout: float) -> list[Pending]:
        """A batch as soon as a request comes, or [] once the insert is done or ``timeout`` has passed."""
        getter = asyncio.ensure_future(self._queue.get())
        try:
            await asyncio.wait((getter, inserting), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            getter.cancel()  # no-op if it has a request already
        try:
            first = await getter
        except asyncio.CancelledError:
            # A cancelled get leaves its request in the queue; but a cancel of
            # this task (a shutdown) that lands here must not be taken for it.
            current = asyncio.current_task()
            if getter.cancelled() and current is not None and not current.cancelling():
                return []
            raise
        return await self.next_batch(first)

    async def linger(self, mirror: Mirror, conn: Connection) -> list[Pending]:
        """The next batch: the answered clients' next requests, taken as they
        come while Mongo works (each finished insert hands on what was committed
        meanwhile); [] once Mongo has everything and nobody else asks, or
        another process is queued for the lock (past the grace, with the insert
        still in flight: it is left so, see ``under_lock``)."""
        core, started = self._core, time.monotonic()
        while True:
            batch = await self.next_batch(None)
            if batch or mirror.inserting is None:
                break
            patience = core.mongo_patience(time.monotonic() - started)
            if patience is None:
                self._leave(mirror.inserting, started)
                return []
            batch = await self._request_or_done(mirror.inserting, patience)
            if batch:
                return batch
            if mirror.inserting.done():
                await mirror.settle()
            elif not core.queued:
                core.others_asked(await self._sql.others_waiting(conn))
        if batch or await self._sql.others_waiting(conn):
            return batch
        return await self.next_batch(None)

    async def under_lock(self, conn: Connection, task: asyncio.Future) -> bool:
        """Waits for ``task``, Mongo work of a turn that holds the lock: True once
        it is done (its error raised). False once another process is queued for
        the lock and it has waited ``handover_grace_seconds``: then it is left
        running, and the turn hands the lock over (``WriterCore.mongo_patience``).
        Whether anyone is queued is asked at the grace, then every ``handover_check_seconds``."""
        core, started = self._core, time.monotonic()
        try:
            while not task.done():
                patience = core.mongo_patience(time.monotonic() - started)
                if patience is None:
                    self._leave(task, started)
                    return False
                await asyncio.wait({task}, timeout=patience)
                if not task.done() and not core.queued:
                    core.others_asked(await self._sql.others_waiting(conn))
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                task.cancel()  # a shutdown: the work goes with the turn, as when it was awaited
            self._keep(task)
            raise
        task.result()
        return True

    def _leave(self, task: asyncio.Future, started: float) -> None:
        """The turn leaves ``task`` in flight and will hand the lock over (once per turn: the core's ``left``)."""
        self._keep(task)
        if self._core.left:
            return
        self._core.mongo_left(time.monotonic())
        log.warning("event=mongo_left_in_flight partition=%d waited_s=%.2f reason=another_writer_queued "
                    "action=lock_handed_over meaning=mongo_slow_or_hung_here_the_next_turn_copies_the_outbox",
                    self._partition, time.monotonic() - started)

    def _keep(self, task: asyncio.Future) -> None:
        """Holds ``task``, which no turn awaits any more, till it ends (the loop keeps only weak references)."""
        self._left.add(task)
        task.add_done_callback(self._left_done)

    def _left_done(self, task: asyncio.Future) -> None:
        self._left.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its failure, if any, was taken where it happened (_insert_failed)

    def record_when_done(self, task: asyncio.Future, proven: Callable[[Any], int], last_id: int) -> None:
        """Once ``task``, left in flight, is done: records the mirrored_upto its
        success proves (``proven(result)``; 0: nothing). Later turns then do not
        copy those ids again: each such copy would be a duplicate, and a
        duplicate is checked by a read that scans the collection on FerretDB."""
        async def record() -> None:
            try:
                upto = proven(await task)
            except Exception:  # a failure leaves the outbox, and was logged where it happened
                return
            self._core.left_call_landed()
            if upto:
                await self._sql.mark_alone(upto, last_id)

        self._keep(asyncio.ensure_future(record()))
