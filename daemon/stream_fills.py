"""The stream's reads of the truth: the oplog's documents checked against
MySQL, what is committed past its position, from MySQL by primary key up to
the committed head, else from the `messages` collection, and the ids passed
over for good (expired or deleted).

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

from chat.messages import shown_digest, shown_digest_of
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
    _committed: int
    _head_known: bool
    _mysql_backoff: Backoff
    _mysql_rests_until: float
    _waiting_since: float | None
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

    def _reject(self, reason: str, source: str, ids: list, action: str = "skipped") -> None:
        raise NotImplementedError

    def _release(self, docs: list[dict], received: float) -> None:
        raise NotImplementedError

    async def _fill_from_truth(self, ahead: bool = True) -> None:
        """Settles the documents held past the bound, in one read of MySQL
        (``StreamRanges.confirm``): those past its committed head are not the
        writer's and are dropped; those up to it are released as they came if
        they are exactly MySQL's rows (a count and a digest of them), else
        MySQL's rows are released in their place. ``ahead``: also release what
        MySQL has committed past them (the gap check's and the start's reads).
        Whenever MySQL cannot say, the collection is read instead (``_fill_unconfirmed``)."""
        if self._fill_retry is not None:
            return  # a retry is already scheduled
        ranges = self._ranges
        if ranges is None:  # no MySQL: `messages` alone (development only)
            await self._fill_from_collection(None, through=False)
            return
        hole = self._seq.hole
        upto = hole[1] if hole else self.position
        if time.monotonic() < self._mysql_rests_until:
            await self._fill_unconfirmed()
            return
        try:
            truth = await ranges.confirm(self.position, upto)
        except SQLAlchemyError as exc:
            delay = self._mysql_backoff.next()
            self._mysql_rests_until = time.monotonic() + delay
            log.warning("event=committed_head_failed error=%s mysql_retry_in_s=%.1f", exc.__class__.__name__, delay)
            await self._fill_unconfirmed()
            return
        self._mysql_backoff.reset()
        self._committed, self._head_known = max(self._committed, truth.head), True
        if dropped := self._seq.drop_above(truth.head):
            self._reject("past_committed_head", "oplog", dropped)
        span = min(upto, truth.head)
        if span > self.position:
            shown = self._seq.held_upto(span)
            if len(shown) == truth.rows == span - self.position and shown_digest_of(shown) == truth.digest:
                self._release(self._seq.confirm(span), self._waiting_since or time.perf_counter())
        if (ahead or self._seq.hole) and self.position < truth.head:
            if not await self._fill_from_mysql(ranges, truth.head):
                await self._fill_from_collection(truth.head, through=False)

    async def _fill_unconfirmed(self) -> None:
        """MySQL cannot say: the documents up to the committed head last read
        from it (else, none read yet, up to meta.head) are released unchecked,
        from the oplog or else from `messages`; those past it wait for MySQL."""
        if not self._head_known:
            await self._fill_from_collection(None, through=False)
            return
        self._release(self._seq.confirm(self._committed), self._waiting_since or time.perf_counter())
        self._seq.drop_above(self._committed)  # read back from MySQL once it answers (the gap check)
        if self._seq.hole:
            await self._fill_from_collection(self._committed, through=False)

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
            if upto is not None:
                # what `messages` holds up to the head is taken as it is (MySQL cannot
                # say, or lacks those ids), and what the oplog showed of it; past it, nothing
                self._release(self._seq.confirm(upto), self._waiting_since or time.perf_counter())
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
            self._replace_held(docs[expired:])
        return True

    def _replace_held(self, truth: list[dict]) -> None:
        """Releases MySQL's rows in place of the documents held for their ids;
        a held document that shows something else is logged as a stray."""
        if not truth:
            return
        held = {d["_id"]: d for d in self._seq.held_upto(truth[-1]["_id"])}
        if held and (differ := [d["_id"] for d in truth
                                if (h := held.get(d["_id"])) is not None and shown_digest(h) != shown_digest(d)]):
            self._reject("differs_from_mysql", "oplog", differ, action="replaced_by_mysql_row")
        self._release(self._seq.offer_truth(truth), self._waiting_since or time.perf_counter())

    def _skip(self, upto: int) -> None:
        log.error("event=stream_skip after=%d upto=%d reason=expired_or_deleted", self.position, upto)
        self.cache.clear()  # it must stay contiguous
        self._release(self._seq.skip_to(upto), time.perf_counter())
