"""The message stream of one partition in one daemon: oplog -> sequencer -> hub.

Three parts, each with one job, held by the stream: the tail reader
(``daemon.tail_reader``) reads the oplog into a bounded inbox; the consumer
(``daemon.stream_consumer``) takes it, puts ids in order and hands what it
releases to the partition's hub and the recent cache (daemon/recent_cache.py,
which serves catch-up, daemon/catchup.py); the reader of the truth
(``daemon.stream_fills``) settles what the consumer holds: what MySQL has
committed past the position, by primary key (db/stream_ranges.py), else,
whenever MySQL cannot say, the `messages` collection. The fast store is not
trusted blindly: only documents in the writer's shape are released, and only
once MySQL has shown them to be its rows (``TruthReader.fill``: one read per
batch, not per message). The stream itself starts them, runs the gap check,
and answers catch-up.

Through a relay that routes by user (relay/routing.py), the stream gets the
entries of the users this daemon holds, and the other ids only: it holds a
user (``hold``) before the user's first socket registers, so that the
socket's catch-up joins the live stream where the relay began to serve the
user (daemon/interest.py), and lets the user go after its last.

A partition's stream reads its own table, collection and meta documents
(``chat.partitions``; partition 0's are the single stream's) and hands its
messages to its own hub, which holds the connections of that partition's
users only: a message reaches each user from the stream of the user's
partition, once (docs/decisions/partitioned-delivery.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any, NoReturn

import pymongo
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from chat.messages import Encoded, encode_doc
from chat.stopping import reraise_if_cancelling
from daemon import catchup, metrics, store_reads, stream_fills
from daemon.catchup import CatchUp
from daemon.hub import Hub
from daemon.interest import Interest
from daemon.recent_cache import RecentCache
from daemon.stream_consumer import Consumer, admit
from daemon.stream_fills import TruthReader
from daemon.tail_reader import ConsumerInbox, TailReader
from db import mongo
from db.stream_ranges import StreamRanges
from oplog.backoff import Backoff
from oplog.events import OplogSource
from relay.client import RelayTail

log = logging.getLogger("chat.stream")


class LoopEnded(RuntimeError):
    """A loop of the stream returned: it was to run for the stream's life."""


async def _for_life(name: str, loop: Coroutine[Any, Any, None]) -> NoReturn:
    """Runs ``loop``; if it returns, raises: a TaskGroup ends on a raise only,
    and a loop that returns must end the stream as one that fails does."""
    await loop
    raise LoopEnded(f"{name} ended")


class Stream:
    def __init__(self, db: AsyncDatabase, tail: OplogSource, hub: Hub, *, retention_seconds: int,
                 cache_max: int, gap_check_seconds: float, cache_max_bytes: int = 64 << 20,
                 ranges: StreamRanges | None = None, partition: int = 0,
                 encode: Callable[[dict], Encoded] = encode_doc, primary: bool = True,
                 relay: RelayTail | None = None, linger_seconds: float = 5.0):
        """``encode``: a document as it is cached and sent (``daemon.partitioning.frame_encoder``);
        ``primary``: this stream's position and lag are the daemon's unlabelled gauges;
        ``relay``: the daemon's relay, if it routes by user (``relay.by_user``): then
        ``linger_seconds`` is how long a user stays held after its last socket."""
        self._db = db
        self.partition = partition
        self._encode = encode
        self._ranges = ranges  # holes below a shown id, read from MySQL
        self._tail = tail
        self._retention = retention_seconds
        self._gap_check = gap_check_seconds
        self.cache = RecentCache(cache_max, cache_max_bytes)
        self.inbox = ConsumerInbox()
        self.reader = TailReader(tail, self.inbox)
        self.consumer = Consumer(hub, self.cache, tail.namespace, encode=encode, partition=partition,
                                 primary=primary, checked_by_mysql=ranges is not None)
        self.truth = TruthReader(db, ranges, self.consumer, self.inbox.request_fill, partition=partition,
                                 retention_seconds=retention_seconds)
        self._stored_ids = store_reads.StoredIds(db, partition)
        # MySQL's committed head as read at the gap check before: what was
        # committed a whole period ago and is still not released is read from
        # MySQL (the fast store lags, or the tail stopped).
        self._committed_before = 0
        self.ready = asyncio.Event()
        self._relay = relay if relay is not None and relay.by_user else None
        self._linger = linger_seconds
        self.interest = Interest() if self._relay is not None else None
        # Per user waiting for its relay marker: the marker that serves it wakes its sockets
        # only. One event for all, set at every marker, woke every waiting socket at each: a
        # restart's reconnects, thousands waiting at once, cost a wake-up per waiter per marker.
        self._marked: dict[str, asyncio.Event] = {}
        if self.interest is not None:
            self.consumer.on_subscribed = self._subscribed

    @property
    def position(self) -> int:
        """The highest id released: every id up to it has gone out, in order."""
        return self.consumer.position

    def use_encoder(self, encode: Callable[[dict], Encoded]) -> None:
        """How documents are encoded from now on: a new slot map's epoch in
        their cursors (``daemon.handover``). What the recent cache holds keeps
        the cursors it went out with: still valid for every user whose slot did
        not move, and the users whose slot moved are handed over, not served it."""
        self._encode = encode
        self.consumer.use_encoder(encode)

    # --- start-up -------------------------------------------------------
    async def start(self) -> None:
        """Sets the position to the newest committed message and fills the
        cache. The oplog resume point is read first, so nothing lands between
        the two. With MySQL, both come from it by primary key: a read of the
        recent messages from `messages` is a full scan on FerretDB, which took
        a daemon about 10 s at 50,000 messages before it served, and its peak
        of decoded documents stayed in the process as some 300 MB."""
        backoff = Backoff(base=0.5, cap=10.0)
        page = stream_fills.PAGE
        while True:
            try:
                # Without MySQL, the cache read gets the fill's time limit; a
                # failed one starts over, never leaving the daemon un-ready for good.
                with pymongo.timeout(stream_fills.FILL_TIMEOUT_SECONDS):
                    last_ts = await self._tail.newest_ts()
                    high = await self.truth.read_committed()  # None without MySQL (no ranges)
                    from_mysql = (high is not None and self._ranges is not None
                                  and await store_reads.cache_from_mysql(self._ranges, self.cache, high, page,
                                                                         self._encode))
                    # What the fast store holds, all of it up to here (meta.head, which the
                    # writer moves only past ids it has copied there): below it, catch-up reads it.
                    stored = await mongo.newest_id(self._db, self.partition)
                    if high is None:
                        high = stored
                    if not from_mysql and self.cache.max_messages and high:
                        most = self.cache.max_messages
                        self.cache.extend(admit(await mongo.messages_between(
                            self._db, max(0, high - most), high, most, self.partition), "stored"), self._encode)
                break
            except PyMongoError as exc:
                reraise_if_cancelling()
                self.cache.clear()
                delay = backoff.next()
                log.warning("event=stream_start_retry error=%s retry_in_s=%.1f", exc.__class__.__name__, delay)
                await asyncio.sleep(delay)
        self._tail.last_ts = last_ts
        self.consumer.start_at(high, stored)
        # What is past those reads, now: a client resuming here finds this daemon as far along as its last one.
        await self.truth.fill()
        self.ready.set()
        log.info("event=stream_ready position=%d cached=%d", high, len(self.cache))

    # --- the loop ---------------------------------------------------------
    async def run(self) -> None:
        """Three loops: the reader keeps the oplog cursor moving while the
        consumer keeps up (a tail that pauses falls off a small oplog), the
        consumer releases, and has every read of the truth made, the gap
        check covers what the oplog never shows. The reader and the consumer
        meet in a bounded inbox; past its bound the reader waits
        (``daemon.tail_reader.ConsumerInbox.put``).
        Each loop runs for the life of the stream: one that ends, by an error
        or otherwise, ends the stream with it (the daemon then exits, and
        supervisord starts a fresh one) instead of leaving the rest waiting:
        the TaskGroup cancels the others and waits for them."""
        await self.start()
        try:
            async with asyncio.TaskGroup() as loops:
                loops.create_task(_for_life("stream-consumer", self.consumer.run(self.inbox, self.truth.fill)))
                loops.create_task(_for_life("oplog-reader", self.reader.run()))
                loops.create_task(_for_life("gap-check", self._periodic_gap_check()))
        except BaseExceptionGroup as group:
            ended = group.exceptions[0]
        # Raised here, not in the handler: what stopped the first loop to end,
        # as it was raised (the daemon logs it), rather than the group that holds it.
        raise ended

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
            reraise_if_cancelling()  # a cancel a driver call returned from (see Consumer.run)
            await asyncio.sleep(self._gap_check)
            # From the truth first: delivery must not wait for the fast store.
            # What MySQL had committed a whole period ago and is still not
            # released (the writer's outbox while Mongo is down or slow, or a
            # stopped tail) is read from MySQL now.
            committed = await self.truth.read_committed()
            if committed is not None:
                if self._committed_before > self.position:
                    self.inbox.request_fill()
                    self.consumer.note_stuck()
                self._committed_before = committed
                if committed <= self.position:
                    # Nothing committed past what was released (an idle stream): the fast
                    # store, which holds committed rows only, has nothing past it either.
                    last_position = self.position
                    continue
            try:
                newest = await mongo.newest_id(self._db, self.partition)
                if newest > self.position and self.position == last_position:
                    self.inbox.request_fill()
                    self.consumer.note_stuck()
                last_position = self.position
            except PyMongoError as exc:
                reraise_if_cancelling()
                log.warning("event=gap_check_failed error=%s", exc.__class__.__name__)

    async def wait_for(self, position: int, timeout: float) -> bool:
        """Whether the position reaches ``position`` within ``timeout`` seconds."""
        return await self.consumer.wait_for(position, timeout)

    async def is_stored(self, msg_id: int) -> bool:
        """Whether ``msg_id`` was ever written (ids are gap-free); on a read
        error, assume so: the client is told to retry, not to reload."""
        return await self._stored_ids.contains(msg_id, max(self.position, self.truth.committed),
                                             self.truth.read_committed)

    # --- the users the relay serves this daemon (routed by user) ------------
    @property
    def by_user(self) -> bool:
        return self.interest is not None

    def _subscribed(self, token: int, seen: int) -> None:
        if self.interest is not None:
            for user in self.interest.subscribed(token, seen):
                if (marked := self._marked.pop(user, None)) is not None:
                    marked.set()

    async def hold(self, user: str, timeout: float) -> bool:
        """Holds ``user`` (asks the relay for it, on its first socket), and
        returns once the relay's marker for it has come: every entry of the
        user past it reaches this daemon whole. Then ``join``, with no await
        before the socket registers. False: not within ``timeout`` (the caller
        still ``release``s it)."""
        interest, relay = self.interest, self._relay
        if interest is None or relay is None:
            return True
        if interest.hold(user):
            interest.asked(user, relay.want(self._tail.namespace, user))
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                while interest.covered_from(user) is None:
                    await self._marked.setdefault(user, asyncio.Event()).wait()
        except TimeoutError:
            return False
        return True

    def join(self, user: str) -> None:
        """Makes every id up to the user's marker that is not released yet
        come whole: called after ``hold``, with no await before the position
        is read and the socket registered (``daemon.server.Daemon.subscribe``).

        The socket's catch-up covers (since, position] and its live frames
        the rest, each id once, as on a daemon of whole namespaces. Below the
        marker, what is not released yet is of three kinds: ids never seen
        (a hole), which only a whole document fills (the stores' rows, or the
        relay's entry, which comes now that the user is served); documents
        held whole, which go out to the user live, as any document; and ids
        passed over, which came without the user's entries: released as they
        are, a message of the user's among them would go out blank, to
        nobody, past the position its catch-up read to. So those, and only
        those, are made holes again, and the truth is read for them at once
        (nothing above them may be held to show the hole). The socket then
        need not wait until the stream has released up to the marker: a hole
        below it (ids a writer committed to MySQL and never put in the fast
        store, a MySQL or fast store that is slow to answer) held every new
        user's first socket until it was filled, or ``HOLD_WAIT`` answered
        1013, where a daemon of whole namespaces registers at once. The cost:
        the forgotten ids are read as rows rather than checked by their
        digests, and a hole's fill reads its rows anyway."""
        interest = self.interest
        since = None if interest is None else interest.covered_from(user)
        if since is not None and since > self.position and self.consumer.unpass(since):
            self.inbox.request_fill()

    def release(self, user: str) -> None:
        """A socket of ``user`` that ``hold`` held is gone: after the last, once
        the linger is over, the relay is told to stop."""
        if self.interest is None:
            return
        generation = self.interest.release(user)
        if generation is not None:
            asyncio.get_running_loop().call_later(self._linger, self._expire, user, generation)

    def _expire(self, user: str, generation: int) -> None:
        if self.interest is not None and self._relay is not None and self.interest.expire(user, generation):
            self._marked.pop(user, None)  # its sockets that waited for a marker gave up (none holds it now)
            self._relay.drop(self._tail.namespace, user)

    def _cache_serves(self, user: str, since: int) -> bool:
        """Whether the recent cache holds every message of ``user`` after
        ``since`` that it covers: routed by user, those past the user's
        ``covered_from`` only (before it, the entries went to other daemons)."""
        if self.interest is None:
            return True
        covered = self.interest.covered_from(user)
        return covered is not None and since >= covered

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
        store, whose reads say where messages expired while it was read.

        The store read covers only what the fast store is known to hold
        (``Consumer.shown``): the ids the stream released past it came from
        MySQL (a writer's outbox, which the fast store gets at the next
        writer's repair), and reading them from the fast store would skip
        them without a word. They come from the cache, which holds them whole
        (only the oplog's ids, all at most ``shown``, can be blanks), else
        from MySQL, as the stream's own fills do."""
        covered = None if self.interest is None else self.interest.covered_from(user)
        if since >= upto:
            items = catchup.no_items()
        elif self.cache.covers(since, upto) and self._cache_serves(user, since):
            metrics.CATCHUPS_FROM_CACHE.inc()
            items = catchup.from_entries(self.cache.between(since, upto), user)
        elif covered is not None and self._ranges is not None and self.cache.covers(since, upto):
            # Routed by user, a first socket resuming from before the relay served its user:
            # the cache holds the range, but the user's entries up to ``covered`` are blanks
            # (they went to the daemons that held the user then). Those come from MySQL by
            # the user, a short range of the primary key, not from the fast store: on
            # FerretDB that read is a scan of `messages`, and a killed host's clients all
            # come at once (each scan slowed the tails of every daemon until none delivered).
            metrics.CATCHUP_QUERIES.labels("mysql").inc()
            cut = min(covered, upto)
            parts = [store_reads.committed_items(self._ranges, user, since, cut, stream_fills.PAGE, self._encode)]
            if cut < upto:
                parts.append(catchup.from_entries(self.cache.between(cut, upto), user))
            items = catchup.chained(*parts)
        else:
            ranges, page = self._ranges, stream_fills.PAGE
            # Without MySQL the fast store is all there is: it answers for the whole range.
            stored = catchup.stored_upto(since, upto, self.consumer.shown if ranges is not None else upto)
            parts = []
            if stored > since:
                metrics.CATCHUP_QUERIES.labels("mongo").inc()
                # One past the page: the first page, all a long-poll needs, is one
                # read of the store (a full scan on FerretDB) and still knows there is more.
                parts.append(store_reads.stored_items(self._db, user, since, stored,
                                                      page if most is None else min(page, most + 1),
                                                      self._retention, lambda docs: admit(docs, "stored"),
                                                      self.partition, self._encode))
            if stored < upto and ranges is not None:
                if self.cache.covers(stored, upto):  # a snapshot taken now, before the store is read
                    parts.append(catchup.from_entries(self.cache.between(stored, upto), user))
                else:
                    metrics.CATCHUP_QUERIES.labels("mysql").inc()
                    parts.append(store_reads.committed_items(ranges, user, stored, upto, page, self._encode))
            items = catchup.chained(*parts)
        return catchup.paginate(items, mongo.expired_before(self._retention), most, max_bytes)
