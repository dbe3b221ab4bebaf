"""The message stream of one partition in one daemon: oplog -> sequencer -> hub.

Owns the stream position (the highest id released), the recent-message
cache (daemon/recent_cache.py) that serves catch-up (daemon/catchup.py), and
the reads of the truth: what MySQL has committed past the position, by
primary key (db/stream_ranges.py), else, whenever MySQL cannot say, the
`messages` collection. The fast store is not trusted blindly: only documents
in the writer's shape are released, and only once MySQL has shown them to be
its rows (``TruthFills._fill_from_truth``: one read per batch, not per message).

A partition's stream reads its own table, collection and meta documents
(``chat.partitions``; partition 0's are the single stream's) and hands its
messages to its own hub, which holds the connections of that partition's
users only: a message reaches each user from the stream of the user's
partition, once (docs/decisions/partitioned-delivery.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

import pymongo
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError
from sqlalchemy.exc import SQLAlchemyError

from chat.messages import Encoded, encode_doc, inserted_docs, is_message_doc
from daemon import catchup, metrics, store_reads
from daemon.catchup import CatchUp
from daemon.hub import Hub
from daemon.recent_cache import RecentCache
from daemon.sequencer import Sequencer
from daemon.stream_fills import TruthFills
from daemon.wire import text_frame
from db import mongo
from db.stream_ranges import StreamRanges
from oplog.backoff import Backoff
from oplog.events import Batch, OplogSource, Restarted
from chat.stopping import reraise_if_cancelling

log = logging.getLogger("chat.stream")

PAGE = 5000  # one read of the truth; FerretDB scans the whole collection per query anyway
# A read of the truth may take longer than any other query: on FerretDB it
# decodes all of `messages` (seconds at 50,000 documents on a busy machine),
# and one cut off by the usual 10 s socket timeout is all work lost, retried
# from scratch. Messages wait meanwhile; none is lost.
FILL_TIMEOUT_SECONDS = 60.0
TAIL_QUEUE_MAX = 20_000  # oplog entries waiting for the consumer; past it the reader waits
CONFIRM_MAX = 5000  # held documents past which the consumer stops taking batches and reads the truth


@dataclass(frozen=True, slots=True)
class FillRequest:
    """In the consumer's queue, among the oplog batches: "read the truth now"."""


class Stream(TruthFills):
    def __init__(self, db: AsyncDatabase, tail: OplogSource, hub: Hub, *, retention_seconds: int,
                 cache_max: int, gap_check_seconds: float, cache_max_bytes: int = 64 << 20,
                 ranges: StreamRanges | None = None, partition: int = 0,
                 encode: Callable[[dict], Encoded] = encode_doc, primary: bool = True):
        """``encode``: a document as it is cached and sent (``daemon.partitioning.frame_encoder``);
        ``primary``: this stream's position and lag are the daemon's unlabelled gauges."""
        self._db = db
        self.partition = partition
        self._encode = encode
        self._primary = primary
        label = str(partition)
        self._decoded = metrics.OPLOG_DECODED.labels(label)
        self._position_gauge = metrics.PARTITION_POSITION.labels(label)
        self._lag_gauge = metrics.PARTITION_TAIL_LAG.labels(label)
        self._ranges = ranges  # holes below a shown id, read from MySQL
        self._tail = tail
        self._hub = hub
        self._retention = retention_seconds
        self.cache = RecentCache(cache_max, cache_max_bytes)
        self._gap_check = gap_check_seconds
        self._seq = self._sequencer(0)
        # oplog batches (and fill requests) for the consumer, each with the time
        # it arrived; bounded by entries, not batches
        self._inbox: asyncio.Queue[tuple[Batch | FillRequest, float]] = asyncio.Queue()
        self._queued = 0
        self._queue_max = TAIL_QUEUE_MAX
        self._room = asyncio.Event()  # set while the reader may queue more
        self._room.set()
        self._fill_requested = False
        # After a failed read of the truth, wait before the next: on FerretDB each scans
        # all of `messages`, and a retry at once would make a busy FerretDB busier.
        self._fill_backoff = Backoff(base=0.5, cap=10.0)
        self._fill_retry: asyncio.TimerHandle | None = None  # set while a retry waits
        self._advanced = asyncio.Event()  # set and replaced each time the position moves
        self._lag, self._moved_at = 0.0, time.monotonic()  # for the tail-lag gauge
        self._stored_ids = store_reads.StoredIds(db, partition)
        # The highest id MySQL has committed, as last read, and as read at the
        # gap check before: what was committed a whole period ago and is still
        # not released is read from MySQL (the fast store lags, or the tail stopped).
        self._committed, self._committed_before = 0, 0
        self._head_known = False  # MySQL has answered once: _committed is its head
        # After a failed read of MySQL, held documents are settled without it for a
        # while (``TruthFills._fill_unconfirmed``) rather than wait on it batch after batch.
        self._mysql_backoff = Backoff(base=0.5, cap=10.0)
        self._mysql_rests_until = 0.0
        # When the oldest batch whose documents wait for the truth arrived (oplog -> socket counts the wait).
        self._waiting_since: float | None = None
        self.ready = asyncio.Event()

    def _sequencer(self, high: int) -> Sequencer:
        """With MySQL, nothing past ``high`` is released until MySQL confirms it."""
        return Sequencer(high=high, bound=high if self._ranges is not None else None)

    def _limits(self) -> tuple[int, float]:
        return PAGE, FILL_TIMEOUT_SECONDS  # read at each call: tests make them small

    # --- start-up -------------------------------------------------------
    async def start(self) -> None:
        """Sets the position to the newest committed message and fills the
        cache. The oplog resume point is read first, so nothing lands between
        the two. With MySQL, both come from it by primary key: a read of the
        recent messages from `messages` is a full scan on FerretDB, which took
        a daemon about 10 s at 50,000 messages before it served, and its peak
        of decoded documents stayed in the process as some 300 MB."""
        backoff = Backoff(base=0.5, cap=10.0)
        while True:
            try:
                # Without MySQL, the cache read gets the fill's time limit; a
                # failed one starts over, never leaving the daemon un-ready for good.
                with pymongo.timeout(FILL_TIMEOUT_SECONDS):
                    last_ts = await self._tail.newest_ts()
                    high = await self._read_committed()  # None without MySQL (no ranges)
                    from_mysql = (high is not None and self._ranges is not None
                                  and await store_reads.cache_from_mysql(self._ranges, self.cache, high, PAGE,
                                                                         self._encode))
                    if high is None:
                        high = await mongo.newest_id(self._db, self.partition)
                    if not from_mysql and self.cache.max_messages and high:
                        most = self.cache.max_messages
                        self.cache.extend(self._admit(await mongo.messages_between(
                            self._db, max(0, high - most), high, most, self.partition), "stored"), self._encode)
                break
            except PyMongoError as exc:
                reraise_if_cancelling()
                self.cache.clear()
                delay = backoff.next()
                log.warning("event=stream_start_retry error=%s retry_in_s=%.1f", exc.__class__.__name__, delay)
                await asyncio.sleep(delay)
        self._tail.last_ts = last_ts
        self._seq = self._sequencer(high)
        # What is past those reads, now: a client resuming here finds this daemon as far along as its last one.
        await self._fill_from_truth()
        self.ready.set()
        log.info("event=stream_ready position=%d cached=%d", high, len(self.cache))

    # --- the loop ---------------------------------------------------------
    async def run(self) -> None:
        """Three loops: the reader keeps the oplog cursor moving while the
        consumer keeps up (a tail that pauses falls off a small oplog), the consumer releases,
        and does every read of the truth, the gap check covers what the oplog
        never shows. The reader and the consumer meet in a bounded queue; past
        its bound the reader waits (``_read_oplog``).
        Each loop runs for the life of the stream: one that ends, by an error
        or otherwise, ends the stream with it (the daemon then exits, and
        supervisord starts a fresh one) instead of leaving the rest waiting."""
        await self.start()
        loops = [asyncio.create_task(self._consume(), name="stream-consumer"),
                 asyncio.create_task(self._read_oplog(), name="oplog-reader"),
                 asyncio.create_task(self._periodic_gap_check(), name="gap-check")]
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            ended = done.pop()
            ended.result()  # raises what stopped it
            raise RuntimeError(f"{ended.get_name()} ended")
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    async def _consume(self) -> None:
        while True:
            # A cancel that landed in a driver call may come back as a plain
            # return (PyMongo finishes some cancelled operations): the loop
            # must still end, or a shutdown waits for it for ever.
            reraise_if_cancelling()
            item, received = await self._inbox.get()
            ahead = self._step(item, received)
            if self._seq.hole:
                # Documents wait for the truth: whatever else has come meanwhile
                # joins them, so that one read of MySQL settles them all.
                while not self._inbox.empty() and self._seq.held < CONFIRM_MAX:
                    ahead = self._step(*self._inbox.get_nowait()) or ahead
            if ahead or self._seq.hole:
                await self._fill_from_truth(ahead)
            if not self._seq.hole:
                self._waiting_since = None

    def _step(self, item: Batch | FillRequest, received: float) -> bool:
        """Takes one item of the queue; True: it asks for a read of the truth."""
        if isinstance(item, FillRequest):
            self._fill_requested = False
            return True
        self._queued -= len(item.entries)
        if self._queued <= self._queue_max // 2:
            self._room.set()  # the reader takes the oplog again once half the queue is free
        self._take(item, received)
        if self._waiting_since is None and self._seq.hole:
            self._waiting_since = received
        return False

    def _take(self, batch: Batch, received: float) -> None:
        """One oplog batch, without I/O: what is next in the stream goes out now,
        what comes after a hole is held (loadtest/hotpath.py times this)."""
        entries = batch.entries
        docs = [d for entry in entries for d in inserted_docs(entry, self._tail.namespace)]
        metrics.OPLOG_ENTRIES.inc(len(entries))
        self._decoded.inc(len(entries))
        if docs:
            self._release(self._seq.offer(self._admit(docs, "oplog")), received)

    def _admit(self, docs: list[dict], source: str) -> list[dict]:
        """The documents in the writer's shape; the rest is logged, counted and
        skipped (chat.messages.is_message_doc), never a crash of the stream."""
        good = [d for d in docs if is_message_doc(d)]
        if len(good) != len(docs):
            self._reject("shape", source, [d.get("_id") for d in docs if not is_message_doc(d)])
        return good

    @staticmethod
    def _reject(reason: str, source: str, ids: list, action: str = "skipped") -> None:
        metrics.STRAYS.labels(reason).inc(len(ids))
        log.error("event=stray_document reason=%s source=%s count=%d ids=%.200r action=%s "
                  "meaning=a_document_the_writer_did_not_write", reason, source, len(ids), ids[:5], action)

    async def _read_committed(self) -> int | None:
        """The highest id committed to MySQL; None without MySQL or when it fails."""
        if self._ranges is None:
            return None
        try:
            self._committed = max(self._committed, await self._ranges.committed_head())
        except SQLAlchemyError as exc:
            log.warning("event=committed_head_failed error=%s", exc.__class__.__name__)
            return None
        self._head_known = True
        self._mysql_rests_until = 0.0  # MySQL answers again: the next batch is checked against it
        return self._committed

    async def _read_oplog(self) -> None:
        async for event in self._tail.batches():
            if isinstance(event, Restarted):
                # Nothing to do: ids are gap-free, so whatever a re-opened or
                # fallen-off tail missed shows up as a hole (or in the gap
                # check) and is read back then, and only then.
                continue
            size = len(event.entries)
            if self._queued and self._queued + size > self._queue_max:
                # Overload slows the tail down rather than shedding: while the consumer is this
                # far behind, the oplog is not read. Through the relay the batches wait in its
                # buffer for this daemon (32 MB), and a burst that fits is delivered late, with
                # no read of the truth; past that the relay cuts us off, and what we then miss
                # is a hole, read back from MySQL. A paused tail of a small oplog falls off it,
                # with the same outcome.
                metrics.TAIL_BACKPRESSURE.inc()
                log.warning("event=tail_backpressure queued=%d action=wait_for_consumer", self._queued)
                self._room.clear()
                await self._room.wait()
            self._queued += size
            self._inbox.put_nowait((event, time.perf_counter()))

    def _request_fill(self) -> None:
        """Asks the consumer for one read of the truth; requests coalesce until it starts."""
        if not self._fill_requested:
            self._fill_requested = True
            self._inbox.put_nowait((FillRequest(), 0.0))

    def _retry_fill(self) -> None:
        self._fill_retry = None
        self._request_fill()

    async def _periodic_gap_check(self) -> None:
        # Covers an oplog entry that never comes (FerretDB can store a document
        # without writing its oplog entry) when no later entry reveals the hole.
        # It fills only when the tail has stopped short: a stored id is unseen
        # and the position has not moved for a whole period. A tail that is
        # merely behind keeps moving (FerretDB under load answers in hundreds of
        # ms), and a hole in what it shows triggers a fill by itself. Filling
        # for a moving tail made every fill, a full scan on FerretDB, slow the
        # tail and the next fill down until delivery was seconds late.
        last_position = self.position
        while True:
            reraise_if_cancelling()  # a cancel a driver call returned from (see _consume)
            await asyncio.sleep(self._gap_check)
            # From the truth first: delivery must not wait for the fast store.
            # What MySQL had committed a whole period ago and is still not
            # released (the writer's outbox while Mongo is down or slow, or a
            # stopped tail) is read from MySQL now.
            committed = await self._read_committed()
            if committed is not None:
                if self._committed_before > self.position:
                    self._request_fill()
                    self._set_lag(max(self._lag, time.monotonic() - self._moved_at))
                self._committed_before = committed
            try:
                newest = await mongo.newest_id(self._db, self.partition)
                if newest > self.position and self.position == last_position:
                    self._request_fill()
                    # Stuck with messages waiting: the lag keeps growing even
                    # though nothing is released to measure it by.
                    self._set_lag(max(self._lag, time.monotonic() - self._moved_at))
                last_position = self.position
            except PyMongoError as exc:
                reraise_if_cancelling()
                log.warning("event=gap_check_failed error=%s", exc.__class__.__name__)

    def _release(self, docs: list[dict], received: float) -> None:
        if not docs:
            return
        pushes = 0
        for doc in docs:
            encoded = self._encode(doc)
            self.cache.append(encoded)
            msg_id, sender, recipient, _, payload = encoded
            delivered = self._hub.dispatch(msg_id, sender, recipient, payload, text_frame)
            if delivered:
                pushes += delivered
                # dispatch wrote to every socket before returning: this is oplog -> socket
                metrics.OPLOG_TO_SOCKET.observe(time.perf_counter() - received)
        metrics.PUSHES.inc(pushes)
        self._position_gauge.set(self.position)
        if self._primary:
            metrics.POSITION.set(self.position)
        self._lag = max(0.0, time.time() - docs[-1]["created_at"].timestamp())
        self._moved_at = time.monotonic()
        self._set_lag(self._lag)
        self._notify()

    def _set_lag(self, lag: float) -> None:
        self._lag_gauge.set(lag)
        if self._primary:
            metrics.TAIL_LAG.set(lag)

    def _notify(self) -> None:
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()

    async def wait_for(self, position: int, timeout: float) -> bool:
        try:
            async with asyncio.timeout(timeout):
                while self.position < position:
                    await self._advanced.wait()
            return True
        except TimeoutError:
            return False

    async def is_stored(self, msg_id: int) -> bool:
        """Whether ``msg_id`` was ever written (ids are gap-free); on a read
        error, assume so: the client is told to retry, not to reload."""
        return await self._stored_ids.contains(msg_id, max(self.position, self._committed), self._read_committed)

    # --- catch-up -----------------------------------------------------------
    async def catch_up(self, user: str, since: int, upto: int, most: int | None = None) -> CatchUp:
        """The first page of ``pages``: the oldest ``most`` of the user's
        messages with since < id <= upto (all of them if ``most`` is None)."""
        return await catchup.first_page(self.pages(user, since, upto, most))

    def pages(self, user: str, since: int, upto: int, most: int | None = None,
              max_bytes: int | None = None) -> AsyncGenerator[CatchUp, None]:
        """The user's messages (either side) with since < id <= upto, oldest
        first, in pages (``daemon.catchup.paginate`` says how). From the recent
        cache when it covers the range (a snapshot taken now), else from the
        store, whose reads say where messages expired while it was read."""
        if since >= upto:
            items = catchup.no_items()
        elif self.cache.covers(since, upto):
            metrics.CATCHUPS_FROM_CACHE.inc()
            items = catchup.from_cache(self.cache, user, since, upto)
        else:
            metrics.CATCHUP_QUERIES.labels("mongo").inc()
            # One past the page: the first page, all a long-poll needs, is one
            # read of the store (a full scan on FerretDB) and still knows there is more.
            items = store_reads.stored_items(self._db, user, since, upto, PAGE if most is None else min(PAGE, most + 1),
                                             self._retention, lambda docs: self._admit(docs, "stored"),
                                             self.partition, self._encode)
        return catchup.paginate(items, mongo.expired_before(self._retention), most, max_bytes)
