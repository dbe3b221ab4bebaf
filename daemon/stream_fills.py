"""The stream's reads of the truth: what is committed past its position,
from MySQL by primary key up to the committed head, else from the `messages`
collection, and the ids passed over for good (expired or deleted).

A base of ``daemon.stream.Stream``, which owns the state these work on (the
sequencer, the cache, the position) and the one way documents go out
(``_release``). The page and the time limit of a read are the stream's
(``Stream._limits``), read at each call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pymongo
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError
from sqlalchemy.exc import SQLAlchemyError

from chat.stopping import reraise_if_cancelling
from daemon import metrics
from daemon.recent_cache import RecentCache
from daemon.sequencer import Sequencer
from db import mongo
from db.stream_ranges import StreamRanges
from oplog.backoff import Backoff

log = logging.getLogger("chat.stream")


class TruthFills:
    """Declared here, set by ``Stream``: what the fills read and move."""

    _db: AsyncDatabase
    partition: int
    _ranges: StreamRanges | None
    _retention: int
    _seq: Sequencer
    _fill_backoff: Backoff
    _fill_retry: asyncio.TimerHandle | None
    cache: RecentCache
    _retry_fill: Callable[[], None]

    @property
    def position(self) -> int:
        return self._seq.high

    def _limits(self) -> tuple[int, float]:
        """(documents per read, seconds a read may take)."""
        raise NotImplementedError

    async def _read_committed(self) -> int | None:
        raise NotImplementedError

    def _admit(self, docs: list[dict], source: str) -> list[dict]:
        raise NotImplementedError

    def _reject(self, reason: str, source: str, ids: list) -> None:
        raise NotImplementedError

    def _release(self, docs: list[dict], received: float) -> None:
        raise NotImplementedError

    async def _fill_from_truth(self) -> None:
        """Releases what is committed after the position: from MySQL by primary
        key up to its committed head, else (MySQL failing) from `messages`, in
        pages. Held documents past the committed head were not written by the
        writer: they are dropped, never released, and the position never
        moves past that head."""
        if self._fill_retry is not None:
            return  # a retry is already scheduled
        committed = await self._read_committed()
        if committed is None or self._ranges is None:  # no MySQL (then no head either), or it failed
            await self._fill_from_collection(None, through=False)
            return
        if dropped := self._seq.drop_above(committed):
            self._reject("past_committed_head", "oplog", dropped)
        if not await self._fill_from_mysql(self._ranges, committed):
            await self._fill_from_collection(committed, through=False)

    async def _fill_from_collection(self, bound: int | None, through: bool) -> bool:
        """Releases what `messages` holds after the position, up to ``bound``
        (the committed head; None: meta.head, which only the writer writes).
        ``through``: ids up to ``bound`` that it lacks are gone for good (MySQL
        lacks them too), and the position moves past them. False: the read
        failed, and a retry is scheduled."""
        while True:
            try:
                page, limit = self._limits()
                with pymongo.timeout(limit):
                    upto = await mongo.head_hint(self._db, self.partition) if bound is None else bound
                    stored = await mongo.messages_between(self._db, self.position, upto, page, self.partition)
                    docs = self._admit(stored, "stored")
            except PyMongoError as exc:
                reraise_if_cancelling()
                delay = self._fill_backoff.next()
                self._fill_retry = asyncio.get_running_loop().call_later(delay, self._retry_fill)
                log.warning("event=fill_failed error=%s retry_in_s=%.1f", exc.__class__.__name__, delay)
                return False
            self._fill_backoff.reset()
            if not docs:
                hole = self._seq.hole
                if through and upto is not None and self.position < upto:
                    self._skip(upto)
                elif hole and (upto is None or hole[1] <= upto):  # held documents above a range that is gone
                    self._skip(hole[1])
                elif hole and upto is not None:  # not None: the branch above takes a hole when it is
                    # Without MySQL, past meta.head nothing is confirmed: let go of
                    # them; once meta.head passes them, the gap check reads them back.
                    self._seq.drop_above(upto)
                return True
            first = int(docs[0]["_id"])
            if first > self.position + 1:
                self._skip(first - 1)
            metrics.CATCHUP_QUERIES.labels("stream").inc()
            log.info("event=stream_fill after=%d got=%d", self.position, len(docs))
            self._release(self._seq.offer(docs), time.perf_counter())
            if len(docs) < page and not through:
                return True

    async def _fill_from_mysql(self, ranges: StreamRanges, upto: int) -> bool:
        """Releases every id up to ``upto`` (committed) from MySQL; ids its rows
        skip (deleted there) come from `messages` if it still has them, and are
        passed over if not, so that a fill always gets past them. Expired rows
        are skipped, as the sweeper removes them. False: MySQL failed."""
        cutoff = mongo.expired_before(self._retention)
        while self.position < upto:
            try:
                docs = await ranges.between(self.position, upto, self._limits()[0])
            except SQLAlchemyError as exc:
                log.warning("event=fill_mysql_failed error=%s action=read_messages", exc.__class__.__name__)
                return False
            if not docs:
                return False
            if docs[0]["_id"] != self.position + 1:
                if not await self._fill_from_collection(docs[0]["_id"] - 1, through=True):
                    return True  # the collection failed: its retry is scheduled
            expired = next((i for i, d in enumerate(docs) if d["created_at"] >= cutoff), len(docs))
            if expired:
                self._skip(docs[expired - 1]["_id"])
            metrics.CATCHUP_QUERIES.labels("stream_mysql").inc()
            log.info("event=stream_fill source=mysql after=%d got=%d", self.position, len(docs) - expired)
            self._release(self._seq.offer_truth(docs[expired:]), time.perf_counter())
        return True

    def _skip(self, upto: int) -> None:
        log.error("event=stream_skip after=%d upto=%d reason=expired_or_deleted", self.position, upto)
        self.cache.clear()  # it must stay contiguous
        self._release(self._seq.skip_to(upto), time.perf_counter())
