"""The stream's reader of the truth: the oplog's documents checked against
MySQL, what is committed past the stream's position, from MySQL by primary
key up to the committed head, else from the `messages` collection, and the
ids passed over for good (expired or deleted).

It settles what the consumer's sequencer holds (``daemon.stream_consumer``),
and releases through the consumer; a read that failed asks the consumer's
inbox for another once its backoff is over.
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
from daemon.passed import digest, digest_of
from daemon.stream_consumer import Consumer, admit, reject
from db import mongo
from db.stream_ranges import StreamRanges
from oplog.backoff import Backoff

log = logging.getLogger("chat.stream")

# Both read at each call: tests make them small.
PAGE = 5000  # rows (or documents) per read; FerretDB scans the whole collection per query anyway
# A read of `messages` may take longer than any other query: on FerretDB it
# decodes all of the collection (seconds at 50,000 documents on a busy machine),
# and one cut off by the usual 10 s socket timeout is all work lost, retried
# from scratch. Messages wait meanwhile; none is lost.
FILL_TIMEOUT_SECONDS = 60.0


class TruthReader:
    """Holds what the stream knows of MySQL (its committed head, as last
    read) and the backoffs of the reads that failed."""

    def __init__(self, db: AsyncDatabase, ranges: StreamRanges | None, consumer: Consumer,
                 request_fill: Callable[[], None], *, partition: int, retention_seconds: int):
        """``ranges``: the partition's MySQL table (None: no MySQL, `messages` alone);
        ``request_fill``: asks the consumer for a read of the truth (a retry)."""
        self._db = db
        self._ranges = ranges
        self._consumer = consumer
        self._request_fill = request_fill
        self._partition = partition
        self._retention = retention_seconds
        # After a failed read of `messages`, wait before the next: on FerretDB each scans
        # all of `messages`, and a retry at once would make a busy FerretDB busier.
        self._fill_backoff = Backoff(base=0.5, cap=10.0)
        self._fill_retry: asyncio.TimerHandle | None = None  # set while a retry waits
        self.committed = 0  # the highest id MySQL has committed, as last read
        self._head_known = False  # MySQL has answered once: ``committed`` is its head
        # After a failed read of MySQL, held documents are settled without it for a
        # while (``_fill_unconfirmed``) rather than wait on it batch after batch.
        self._mysql_backoff = Backoff(base=0.5, cap=10.0)
        self._mysql_rests_until = 0.0

    @property
    def position(self) -> int:
        return self._consumer.position

    async def read_committed(self) -> int | None:
        """The highest id committed to MySQL; None without MySQL or when it fails."""
        if self._ranges is None:
            return None
        try:
            self.committed = max(self.committed, await self._ranges.committed_head())
        except SQLAlchemyError as exc:
            log.warning("event=committed_head_failed error=%s", exc.__class__.__name__)
            return None
        self._head_known = True
        self._mysql_rests_until = 0.0  # MySQL answers again: the next batch is checked against it
        return self.committed

    def _retry_fill(self) -> None:
        self._fill_retry = None
        self._request_fill()

    async def fill(self, ahead: bool = True) -> None:
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
        seq = self._consumer.seq
        hole = seq.hole
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
        self.committed, self._head_known = max(self.committed, truth.head), True
        if dropped := self._consumer.drop_above(truth.head):
            reject("past_committed_head", "oplog", dropped)
        span = min(upto, truth.head)
        if span > self.position:
            shown = seq.held_upto(span)
            if len(shown) == truth.rows == span - self.position and digest_of(shown) == truth.digest:
                self._consumer.release_held(seq.confirm(span))
        if (ahead or seq.hole) and self.position < truth.head:
            if not await self._fill_from_mysql(ranges, truth.head):
                await self._fill_from_collection(truth.head, through=False)

    async def _fill_unconfirmed(self) -> None:
        """MySQL cannot say: the documents up to the committed head last read
        from it (else, none read yet, up to meta.head) are released unchecked,
        from the oplog or else from `messages`; those past it wait for MySQL."""
        if not self._head_known:
            await self._fill_from_collection(None, through=False)
            return
        seq = self._consumer.seq
        self._consumer.release_held(seq.confirm(self.committed))
        self._consumer.drop_above(self.committed)  # read back from MySQL once it answers (the gap check)
        if seq.hole:
            await self._fill_from_collection(self.committed, through=False)

    async def _fill_from_collection(self, bound: int | None, through: bool) -> bool:
        """Releases what `messages` holds after the position, up to ``bound``
        (the committed head; None: meta.head, which only the writer writes).
        ``through``: ids up to ``bound`` that it lacks are gone for good (MySQL
        lacks them too), and the position moves past them. False: the read
        failed, and a retry is scheduled."""
        consumer = self._consumer
        seq = consumer.seq
        while True:
            try:
                page = PAGE
                with pymongo.timeout(FILL_TIMEOUT_SECONDS):
                    upto = await mongo.head_hint(self._db, self._partition) if bound is None else bound
                    stored = await mongo.messages_between(self._db, self.position, upto, page, self._partition)
                    docs = admit(stored, "stored")
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
                consumer.release_held(seq.confirm(upto))
            if not docs:
                hole = seq.hole
                if through and upto is not None and self.position < upto:
                    consumer.skip_to(upto)
                elif hole and (upto is None or hole[1] <= upto):  # held documents above a range that is gone
                    consumer.skip_to(hole[1])
                elif hole and upto is not None:  # not None: the branch above takes a hole when it is
                    # Without MySQL, past meta.head nothing is confirmed: let go of
                    # them; once meta.head passes them, the gap check reads them back.
                    self._consumer.drop_above(upto)
                return True
            first = int(docs[0]["_id"])
            if first > self.position + 1:
                consumer.skip_to(first - 1)
            metrics.CATCHUP_QUERIES.labels("stream").inc()
            log.info("event=stream_fill after=%d got=%d", self.position, len(docs))
            consumer.release(seq.offer(docs), time.perf_counter())
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
                docs = await ranges.between(self.position, upto, PAGE)
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
                self._consumer.skip_to(docs[expired - 1]["_id"])
            metrics.CATCHUP_QUERIES.labels("stream_mysql").inc()
            log.info("event=stream_fill source=mysql after=%d got=%d", self.position, len(docs) - expired)
            self._replace_held(docs[expired:])
        return True

    def _replace_held(self, truth: list[dict]) -> None:
        """Releases MySQL's rows in place of the documents held for their ids;
        a held document that shows something else is logged as a stray."""
        if not truth:
            return
        seq = self._consumer.seq
        held = {d["_id"]: d for d in seq.held_upto(truth[-1]["_id"])}
        # A message edited or deleted since its insert differs from its oplog
        # document by design: MySQL's latest version goes out, and it is no stray.
        if held and (differ := [d["_id"] for d in truth
                                if (h := held.get(d["_id"])) is not None and digest(h) != digest(d)
                                and "edited_at" not in d and not d.get("deleted")]):
            reject("differs_from_mysql", "oplog", differ, action="replaced_by_mysql_row")
        self._consumer.release_held(seq.offer_truth(truth))
