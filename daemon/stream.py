"""The global message stream of one daemon: oplog -> sequencer -> hub.

Owns the stream position (the highest id released), a bounded cache of
recent messages for fast catch-up, and the reads that fill holes the oplog
left: from MySQL by primary key when the daemon has it (db/stream_ranges.py),
else, and whenever MySQL cannot say, from the `messages` collection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

import pymongo
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError
from sqlalchemy.exc import SQLAlchemyError

from chat.messages import Encoded, encode_doc, inserted_docs, is_message_doc
from daemon import metrics
from daemon.hub import Hub, Item
from daemon.oplog import RESTARTED, Backoff, OplogTail
from daemon.sequencer import Sequencer
from daemon.wire import text_frame
from db import mongo
from db.stream_ranges import StreamRanges

log = logging.getLogger("chat.stream")

PAGE = 5000  # one read of the truth; FerretDB scans the whole collection per query anyway
# A read of the truth may take longer than any other query: on FerretDB it
# decodes all of `messages` (seconds at 50,000 documents on a busy machine),
# and one cut off by the usual 10 s socket timeout is all work lost, retried
# from scratch. Messages wait meanwhile; none is lost.
FILL_TIMEOUT_SECONDS = 60.0
TAIL_QUEUE_MAX = 20_000  # oplog entries waiting for the consumer
FILL = object()  # in the consumer's queue: "read the truth now"


# One cached message: (id, sender, recipient, created_at, JSON payload).
# A plain tuple on purpose: the collector stops tracking an exact tuple of
# ints, strings, bytes and datetimes once it has survived one collection, so
# a full cache adds nothing to the cyclic GC's full passes. As two objects per
# message (a dataclass holding a Message), a 50,000-entry cache was 100,000
# objects that every full collection walked: pauses of 50-130 ms in the
# replay benchmark, every 31,000 or so messages (README, "GC pauses").
Cached = Encoded


@dataclass
class CatchUp:
    recovered: bool
    frames: list[Item]
    more: bool = False  # another page follows


class Stream:
    def __init__(self, db: AsyncDatabase, tail: OplogTail, hub: Hub, *, retention_seconds: int,
                 cache_max: int, gap_check_seconds: float, cache_max_bytes: int = 64 << 20,
                 ranges: StreamRanges | None = None):
        self._db = db
        self._ranges = ranges  # holes below a shown id, read from MySQL
        self._tail = tail
        self._hub = hub
        self._retention = retention_seconds
        self._cache: deque[Cached] = deque(maxlen=cache_max)  # maxlen 0: no cache, catch-up by query
        # Bounded by bytes too: 50,000 messages of 4,000 four-byte characters would be 800 MB.
        self._cache_bytes, self._cache_max_bytes = 0, cache_max_bytes
        self._gap_check = gap_check_seconds
        self._seq = Sequencer(high=0)
        # oplog batches (or FILL) for the consumer; bounded by entries, not batches
        self._inbox: asyncio.Queue[tuple[list[dict] | None, float]] = asyncio.Queue()
        self._queued = 0
        self._queue_max = TAIL_QUEUE_MAX
        self._fill_requested = False
        # After a failed read of the truth, wait before the next: on FerretDB
        # every such read scans all of `messages`, and one that timed out
        # because FerretDB was busy would only make it busier if retried at once.
        self._fill_backoff = Backoff(base=0.5, cap=10.0)
        self._fill_retry: asyncio.TimerHandle | None = None  # set while a retry waits
        self._advanced = asyncio.Event()  # set and replaced each time the position moves
        self._lag, self._moved_at = 0.0, time.monotonic()  # for the tail-lag gauge
        self._lookups = asyncio.Lock()  # is_stored's reads of `messages`, one at a time
        self._known_stored = 0  # the highest id is_stored found in `messages`
        # The highest id MySQL has committed, as last read, and as read at the
        # gap check before: what was committed a whole period ago and is still
        # not released is read from MySQL (the fast store lags, or the tail stopped).
        self._committed, self._committed_before = 0, 0
        self.ready = asyncio.Event()

    @property
    def position(self) -> int:
        return self._seq.high

    # --- start-up -------------------------------------------------------
    async def start(self) -> None:
        """Sets the position to the newest stored message and fills the cache.
        The oplog resume point is read first, so nothing lands between the two."""
        backoff = Backoff(base=0.5, cap=10.0)
        while True:
            try:
                # The cache read is a full scan on FerretDB (seconds at 50,000
                # messages): it gets the fill's time limit, and a failed one
                # starts over, never leaving the daemon un-ready for good.
                with pymongo.timeout(FILL_TIMEOUT_SECONDS):
                    last_ts = await self._tail.newest_ts()
                    high = await self._bounded(await mongo.newest_id(self._db))
                    docs = []
                    if self._cache.maxlen and high:
                        docs = self._admit(await mongo.messages_between(
                            self._db, max(0, high - self._cache.maxlen), high, self._cache.maxlen), "stored")
                break
            except PyMongoError as exc:
                delay = backoff.next()
                log.warning("event=stream_start_retry error=%s retry_in_s=%.1f", exc.__class__.__name__, delay)
                await asyncio.sleep(delay)
        self._tail.last_ts = last_ts
        self._seq = Sequencer(high=high)
        self._cache_extend(docs)
        # meta.head may lag the store by up to a second: read what is past it
        # now, so that a client resuming here right after a restart finds this
        # daemon at least as far along as the one it came from.
        await self._fill_from_truth()
        self.ready.set()
        log.info("event=stream_ready position=%d cached=%d", high, len(self._cache))

    # --- the loop ---------------------------------------------------------
    async def run(self) -> None:
        """Three loops: the reader keeps the oplog cursor moving at all times
        (a tail that pauses falls off a small oplog), the consumer releases,
        and does every read of the truth, the gap check covers what the oplog
        never shows. The reader and the consumer meet in a bounded queue; past
        its bound entries are dropped and the hole is read back by query.
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
            batch, received = await self._inbox.get()
            if batch is FILL:
                self._fill_requested = False
                await self._fill_from_truth()
                continue
            self._queued -= len(batch)
            self._take(batch, received)
            if self._seq.hole:
                await self._fill_from_truth()

    def _take(self, batch: list[dict], received: float) -> None:
        """One oplog batch, without I/O: what is next in the stream goes out now,
        what comes after a hole is held (loadtest/hotpath.py times this)."""
        docs = [d for entry in batch for d in inserted_docs(entry, self._tail.namespace)]
        metrics.OPLOG_ENTRIES.inc(len(batch))
        if docs:
            self._release(self._seq.offer(self._admit(docs, "oplog")), received)

    def _admit(self, docs: list[dict], source: str) -> list[dict]:
        """The documents in the writer's shape; the rest is logged, counted and
        skipped (chat.messages.is_message_doc), never a crash of the stream."""
        good = [d for d in docs if is_message_doc(d)]
        if len(good) != len(docs):
            self._reject("shape", source, [d.get("_id") if isinstance(d, dict) else d for d in docs
                                           if not is_message_doc(d)])
        return good

    @staticmethod
    def _reject(reason: str, source: str, ids: list) -> None:
        metrics.STRAYS.labels(reason).inc(len(ids))
        log.error("event=stray_document reason=%s source=%s count=%d ids=%.200r action=skipped "
                  "meaning=a_document_the_writer_did_not_write", reason, source, len(ids), ids[:5])

    async def _bounded(self, newest: int) -> int:
        """``newest`` (an id read from the fast store), lowered to the committed
        head if MySQL says less: a document past it was not written by the writer."""
        committed = await self._read_committed()
        if committed is not None and newest > committed:
            self._reject("past_committed_head", "stored", [newest])
            return committed
        return newest

    async def _read_committed(self) -> int | None:
        """The highest id committed to MySQL; None without MySQL or when it fails."""
        if self._ranges is None:
            return None
        try:
            self._committed = max(self._committed, await self._ranges.committed_head())
        except SQLAlchemyError as exc:
            log.warning("event=committed_head_failed error=%s", exc.__class__.__name__)
            return None
        return self._committed

    async def _read_oplog(self) -> None:
        async for batch in self._tail.batches():
            if batch is RESTARTED:
                # Nothing to do: ids are gap-free, so whatever a re-opened or
                # fallen-off tail missed shows up as a hole (or in the gap
                # check) and is read back then, and only then.
                continue
            if self._queued + len(batch) > self._queue_max:
                log.warning("event=tail_backlog_full queued=%d action=catch_up_by_query", self._queued)
                self._request_fill()  # what is dropped here is read back from the truth
            else:
                self._queued += len(batch)
                self._inbox.put_nowait((batch, time.perf_counter()))

    def _request_fill(self) -> None:
        """Asks the consumer for one read of the truth; requests coalesce until it starts."""
        if not self._fill_requested:
            self._fill_requested = True
            self._inbox.put_nowait((FILL, 0.0))

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
            await asyncio.sleep(self._gap_check)
            # From the truth first: delivery must not wait for the fast store.
            # What MySQL had committed a whole period ago and is still not
            # released (the writer's outbox while Mongo is down or slow, or a
            # stopped tail) is read from MySQL now.
            committed = await self._read_committed()
            if committed is not None:
                if self._committed_before > self.position:
                    self._request_fill()
                    metrics.TAIL_LAG.set(max(self._lag, time.monotonic() - self._moved_at))
                self._committed_before = committed
            try:
                newest = await mongo.newest_id(self._db)
                if newest > self.position and self.position == last_position:
                    self._request_fill()
                    # Stuck with messages waiting: the lag keeps growing even
                    # though nothing is released to measure it by.
                    metrics.TAIL_LAG.set(max(self._lag, time.monotonic() - self._moved_at))
                last_position = self.position
            except PyMongoError as exc:
                log.warning("event=gap_check_failed error=%s", exc.__class__.__name__)

    async def _fill_from_truth(self) -> None:
        """Releases what is committed after the position: from MySQL by primary
        key up to its committed head, else (MySQL failing, rows expired) from
        `messages`, in pages. Held documents past the committed head were not
        written by the writer: they are dropped, never released, and the
        position never moves past that head."""
        if self._fill_retry is not None:
            return  # a retry is already scheduled
        committed = await self._read_committed()
        if committed is not None:
            if dropped := self._seq.drop_above(committed):
                self._reject("past_committed_head", "oplog", dropped)
            if await self._fill_from_mysql(committed):
                return
        bound = committed
        while True:
            try:
                with pymongo.timeout(FILL_TIMEOUT_SECONDS):
                    if committed is None:
                        bound = await mongo.head_hint(self._db)
                    docs = self._admit(await mongo.messages_between(self._db, self.position, bound, PAGE), "stored")
            except PyMongoError as exc:
                delay = self._fill_backoff.next()
                self._fill_retry = asyncio.get_running_loop().call_later(delay, self._retry_fill)
                log.warning("event=fill_failed error=%s retry_in_s=%.1f", exc.__class__.__name__, delay)
                return
            self._fill_backoff.reset()
            if not docs:
                hole = self._seq.hole
                if hole and (bound is None or hole[1] <= bound):  # held documents above a range that no longer exists
                    self._skip(hole[1])
                elif hole:
                    # Without MySQL, past meta.head nothing is confirmed: let go of
                    # them; once meta.head passes them, the gap check reads them back.
                    self._seq.drop_above(bound)
                return
            first = int(docs[0]["_id"])
            if first > self.position + 1:
                self._skip(first - 1)
            metrics.CATCHUP_QUERIES.labels("stream").inc()
            log.info("event=stream_fill after=%d got=%d", self.position, len(docs))
            self._release(self._seq.offer(docs), time.perf_counter())
            if len(docs) < PAGE:
                return

    async def _fill_from_mysql(self, upto: int) -> bool:
        """Releases every id up to ``upto`` (committed) from MySQL; False: the
        `messages` collection is to be read, because MySQL failed or its rows
        are not the next ids. Expired rows are skipped, as the sweeper removes them."""
        cutoff = mongo.expired_before(self._retention)
        while self.position < upto:
            try:
                docs = await self._ranges.between(self.position, upto, PAGE)
            except SQLAlchemyError as exc:
                log.warning("event=fill_mysql_failed error=%s action=read_messages", exc.__class__.__name__)
                return False
            if not docs or docs[0]["_id"] != self.position + 1:
                return False
            expired = next((i for i, d in enumerate(docs) if d["created_at"] >= cutoff), len(docs))
            if expired:
                self._skip(docs[expired - 1]["_id"])
            metrics.CATCHUP_QUERIES.labels("stream_mysql").inc()
            log.info("event=stream_fill source=mysql after=%d got=%d", self.position, len(docs) - expired)
            self._release(self._seq.offer_truth(docs[expired:]), time.perf_counter())
        return True

    def _skip(self, upto: int) -> None:
        log.error("event=stream_skip after=%d upto=%d reason=expired_or_deleted", self.position, upto)
        self._cache.clear()  # it must stay contiguous
        self._cache_bytes = 0
        self._release(self._seq.skip_to(upto), time.perf_counter())

    def _release(self, docs: list[dict], received: float) -> None:
        if not docs:
            return
        pushes = 0
        for doc in docs:
            encoded = encode_doc(doc)
            self._cache_append(encoded)
            msg_id, sender, recipient, _, payload = encoded
            delivered = self._hub.dispatch(msg_id, sender, recipient, payload, text_frame)
            if delivered:
                pushes += delivered
                # dispatch wrote to every socket before returning: this is oplog -> socket
                metrics.OPLOG_TO_SOCKET.observe(time.perf_counter() - received)
        metrics.PUSHES.inc(pushes)
        metrics.POSITION.set(self.position)
        self._lag = max(0.0, time.time() - docs[-1]["created_at"].timestamp())
        self._moved_at = time.monotonic()
        metrics.TAIL_LAG.set(self._lag)
        self._notify()

    def _cache_extend(self, docs: list[dict]) -> None:
        for doc in docs:
            self._cache_append(encode_doc(doc))

    def _cache_append(self, entry: Cached) -> None:
        # catch_up() indexes the cache by id: it must hold consecutive ids only
        cache = self._cache
        if cache and entry[0] != cache[-1][0] + 1:
            cache.clear()
            self._cache_bytes = 0
        if not cache.maxlen:
            return
        if len(cache) == cache.maxlen:
            self._cache_bytes -= len(cache[0][4])  # append() drops it
        cache.append(entry)
        self._cache_bytes += len(entry[4])
        while self._cache_bytes > self._cache_max_bytes and len(cache) > 1:
            self._cache_bytes -= len(cache.popleft()[4])

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
        error, assume so: the client is told to retry, not to reload.

        meta.head is read first because it is cheap, but it lags the store: the
        writer moves it about once a second, and not while its Mongo writes fail.
        A ``since`` past it may be a message another daemon has delivered already,
        so the store itself is asked before the answer is "no such message"
        (which sends the client to reload history). One lookup at a time: on
        FerretDB each scans `messages`, and a crowd of made-up ids must not
        multiply that."""
        try:
            if msg_id <= max(self._known_stored, self.position, self._committed, await mongo.newest_id(self._db)):
                return True
            async with self._lookups:
                if msg_id <= max(self._known_stored, self.position, self._committed):  # found while this one waited
                    return True
                committed = await self._read_committed()  # the truth, when there is MySQL
                if committed is not None:
                    return msg_id <= committed
                if not await mongo.is_stored(self._db, msg_id):
                    return False
                self._known_stored = max(self._known_stored, msg_id)  # ids are gap-free: all below exist too
                return True
        except PyMongoError:
            return True

    def _cached(self, start: int, count: int) -> list[Cached]:
        """cache[start:start + count], walked from the nearer end: catch-up
        mostly asks for the newest few, and islice from the left would step
        over up to 50,000 entries (240 us) to get there."""
        n = len(self._cache)
        if start <= n - start:
            return list(itertools.islice(self._cache, start, start + count))
        newest_first = list(itertools.islice(reversed(self._cache), n - start))
        newest_first.reverse()
        return newest_first[:count]

    # --- catch-up -----------------------------------------------------------
    async def catch_up(self, user: str, since: int, upto: int, most: int | None = None) -> CatchUp:
        """The first page of ``pages``: the oldest ``most`` of the user's
        messages with since < id <= upto (all of them if ``most`` is None)."""
        return await first_page(self.pages(user, since, upto, most))

    async def pages(self, user: str, since: int, upto: int, most: int | None = None,
                    max_bytes: int | None = None) -> AsyncIterator[CatchUp]:
        """The user's messages (either side) with since < id <= upto, oldest
        first, in pages of at most ``most`` messages and ``max_bytes`` of
        payload (one message at least); the last page has ``more`` False.

        A page's ``recovered`` is False if messages before or in it were left
        out for having expired. On the first page that sends the client to
        reload history. On a later one, messages expired while the client read
        the earlier pages: a caller must not pass that page on as if nothing
        were missing (the WebSocket closes, and the client's resume finds the
        gap). The cache is a snapshot taken at the start, so only reads of the
        store can meet such a gap (``_stored`` says where)."""
        cutoff = mongo.expired_before(self._retention)
        page = _Page(most, max_bytes)
        if since >= upto:
            items = _no_items()
        elif self._cache and self._cache[0][0] <= since + 1 and self._cache[-1][0] >= upto:
            metrics.CATCHUPS_FROM_CACHE.inc()
            items = self._from_cache(user, since, upto)
        else:
            metrics.CATCHUP_QUERIES.labels("mongo").inc()
            # One past the page: the first page, all a long-poll needs, is one
            # read of the store (a full scan on FerretDB) and still knows there is more.
            items = self._stored(user, since, upto, PAGE if most is None else min(PAGE, most + 1))
        try:
            async for item in items:
                if item is GAP:
                    # What was read before the gap goes out as it was; the page
                    # after it says that messages are missing.
                    if page.frames:
                        yield page.result(more=True)
                        page = _Page(most, max_bytes)
                    page.recovered = False
                    continue
                msg_id, created_at, payload = item
                if created_at < cutoff:
                    page.recovered = False
                    continue
                if page.full(len(payload)):
                    yield page.result(more=True)
                    page = _Page(most, max_bytes)
                page.add(msg_id, payload)
            yield page.result(more=False)
        finally:
            await items.aclose()  # a reader that stops early leaves no store read suspended

    async def _from_cache(self, user: str, since: int, upto: int) -> AsyncIterator[tuple[int, datetime, bytes]]:
        start = since + 1 - self._cache[0][0]
        for msg_id, sender, recipient, created_at, payload in self._cached(start, upto - since):
            if recipient == user or sender == user:
                yield msg_id, created_at, payload

    async def _stored(self, user: str, since: int, upto: int, limit: int) -> AsyncIterator:
        """The user's messages from `messages`, ``limit`` per read, and GAP
        where some of them may have been deleted before a read: the retention
        floor (the sweeper raises it before it deletes) or the TTL edge passed
        the read position."""
        after, newest = since, None
        while True:
            found = await mongo.messages_for(self._db, user, after, upto, limit)
            docs = self._admit(found, "stored")
            # Read after the query, for the floor to cover what it deleted.
            if await mongo.retention_floor(self._db) > after or (
                    newest is not None and newest < mongo.expired_before(self._retention)):
                yield GAP
            for doc in docs:
                msg_id, _, _, newest, payload = encode_doc(doc)
                yield msg_id, newest, payload
            if len(found) < limit:
                return
            after = found[-1]["_id"]  # a number (the query compares numbers), not always the writer's


GAP = object()  # in a catch-up's items: messages may be missing here


async def _no_items() -> AsyncIterator:
    return
    yield  # an async generator that yields nothing


async def first_page(pages: AsyncIterator[CatchUp]) -> CatchUp:
    """The first page of a catch-up; the rest is never read."""
    try:
        return await anext(pages)
    finally:
        await pages.aclose()


class _Page:
    """One page of a catch-up being filled, oldest first."""

    __slots__ = ("most", "max_bytes", "recovered", "frames", "size")

    def __init__(self, most: int | None, max_bytes: int | None):
        self.most, self.max_bytes = most, max_bytes
        self.recovered, self.frames, self.size = True, [], 0

    def full(self, adding: int) -> bool:
        """Whether a payload of ``adding`` bytes must start the next page."""
        return bool(self.frames) and (len(self.frames) == self.most
                                      or (self.max_bytes is not None and self.size + adding > self.max_bytes))

    def add(self, msg_id: int, payload: bytes) -> None:
        self.frames.append((msg_id, payload, None))
        self.size += len(payload)

    def result(self, more: bool) -> CatchUp:
        return CatchUp(self.recovered, self.frames, more)
