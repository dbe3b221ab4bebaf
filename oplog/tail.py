"""Tails local.oplog.rs. One loop owns the cursor and the resume point.

What it does, after Meteor's oplog tailer:
- a tailable awaitData cursor from the last ``ts`` seen, narrowed to the
  namespaces asked for (a daemon's: its partitions' collections) and
  ``admin.$cmd`` for MongoDB transactions, with ``ns: {$in: [...]}``, which
  FerretDB 1.24 answers too;
- on any error, re-open from that ``ts`` after a capped, jittered backoff;
- a watchdog re-opens a cursor that has been silent for too long;
- after an error, a watchdog restart or a fall-off it tells its consumer
  (``Restarted``); what the oplog did not show is read back from the
  `messages` collection by the consumer: the oplog is the fast path, never
  the only one.

Only find/getMore commands that FerretDB 1.24 and MongoDB share are used.
``batchSize: 1`` on the find matters on FerretDB, which closes a tailable
cursor whose first batch is shorter than the batch size.

On FerretDB the cursor is tailable but not awaitData, and is polled every
``ferretdb_poll_seconds``: FerretDB answers an awaitData getMore by re-running
the query and re-decoding the whole oplog every 10 ms while it waits, and
twice more once data arrives (the figures: docs/decisions/ferretdb-tail.md).
MongoDB wakes an awaitData cursor when an entry commits, so there the cursor
waits on the server.

Each poll costs FerretDB a read of the oplog, so after a second of empty polls
the period doubles at each empty poll up to ``ferretdb_idle_poll_seconds``
(``oplog.pace``), and ``wake()`` (the writer's publish after an insert, through
Redis: ``oplog.wake``) cuts such a wait short. Without a wake the delay of the
first entry after a quiet spell is bounded by that cap
(docs/decisions/idle-costs-nothing.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from bson import Timestamp
from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from db import mongo
from prometheus_client import Counter, Histogram

from oplog.backoff import Backoff
from oplog.events import ENTRY_FIELDS, Batch, OplogEvent, Restarted
from oplog.pace import PollPace
from chat.stopping import reraise_if_cancelling

log = logging.getLogger("chat.oplog")

WAKES = Counter("chat_oplog_tail_wakes_total", "Wakes (a write committed) that cut a polled tail's idle backoff short")
# On FerretDB each poll's getMore re-reads the oplog up to the cursor: its time is most of a
# message's wait between the fast store and the relay. On MongoDB a getMore waits for entries.
GETMORE = Histogram("chat_oplog_tail_getmore_seconds", "A tail's getMore, sent to answered (FerretDB: one poll; "
                    "MongoDB: includes awaitData's wait)",
                    buckets=(.001, .0025, .005, .01, .015, .02, .03, .05, .075, .1, .25, .5, 1, 2.5))

REOPEN_PAUSE = 0.02
# The fields a consumer reads, and no others: the server leaves the rest out of its replies
# (loadtest/tail_read.py measures what that saves). MongoDB's entries of retryable writes
# carry more (lsid, txnNumber, stmtId, prevOpTime), and none of it crosses the network now.
ENTRY_PROJECTION = {"_id": 0, **dict.fromkeys(ENTRY_FIELDS, 1)}


async def newest_ts(client: AsyncMongoClient) -> Timestamp | None:
    """The ``ts`` of the oplog's newest entry: where a tail from "now" starts."""
    doc = await client["local"]["oplog.rs"].find_one({}, {"ts": 1}, sort=[("$natural", -1)])
    return doc["ts"] if doc else None


class OplogTail:
    """An ``oplog.events.OplogSource`` on the database's own oplog."""

    def __init__(self, client: AsyncMongoClient, *namespaces: str, await_ms: int = 500,
                 silence_seconds: float = 30.0, batch_size: int = 1000, ferretdb_poll_seconds: float = 0.02,
                 ferretdb_idle_poll_seconds: float = 2.0):
        """``namespaces``: one or more ("db.collection"); the first is ``namespace``."""
        if not namespaces:
            raise ValueError("an oplog tail needs a namespace")
        self._client = client
        self._local = client["local"]
        self.namespace = namespaces[0]
        self.namespaces = namespaces
        self._await_ms = await_ms
        self._silence = silence_seconds
        self._batch = batch_size
        self._ferretdb_poll = ferretdb_poll_seconds
        self._ferretdb_idle_poll = ferretdb_idle_poll_seconds
        self.poll_seconds: float | None = None  # decided at the first open: 0 = awaitData
        self.pace: PollPace | None = None  # a polled tail's (FerretDB's); None: awaitData, or not open yet
        self._woken = asyncio.Event()
        self._idle = False  # the polls are at their idle cap (logged once per quiet spell)
        self._since_wake = False  # a wake cut a backoff short, and no backoff has run out since
        self.last_ts: Timestamp | None = None
        self.restarts = 0
        self.last_activity = time.monotonic()
        self._suspect = True  # something may have been missed: the consumer checks the truth

    async def newest_ts(self) -> Timestamp | None:
        return await newest_ts(self._client)

    async def _decide_mode(self) -> float:
        if self.poll_seconds is None:
            ferretdb, server = await mongo.server(self._client)
            self.poll_seconds = self._ferretdb_poll if ferretdb else 0.0
            if self.poll_seconds:
                self.pace = PollPace(self.poll_seconds, self._ferretdb_idle_poll)
            mode = (f"poll every {self.poll_seconds * 1000:g} ms, idle up to {self._ferretdb_idle_poll * 1000:g} ms"
                    if self.poll_seconds else "awaitData")
            log.info("event=tail_mode server=%s mode=%s", server, mode)
        return self.poll_seconds

    async def _open(self) -> tuple[int, list[dict]]:
        poll = await self._decide_mode()
        if self.last_ts is None:
            self.last_ts = await self.newest_ts() or Timestamp(0, 0)
        # `$gte` and `batchSize: 1` re-read the last entry seen (the consumer
        # drops it as a repeat). Both matter on FerretDB: it closes a tailable
        # cursor whose first batch is shorter than batchSize, and its getMore
        # fails unless the cursor has returned a record it can find again.
        reply = await self._local.command({
            "find": "oplog.rs",
            "filter": {"ts": {"$gte": self.last_ts}, "ns": {"$in": [*self.namespaces, "admin.$cmd"]}},
            "projection": ENTRY_PROJECTION, "tailable": True, "awaitData": not poll, "batchSize": 1,
        })
        cursor = reply["cursor"]
        first = cursor["firstBatch"]
        if first and self.last_ts.time and first[0]["ts"] != self.last_ts:
            # The entry we resume from is gone: the oplog moved past us.
            self._suspect = True
            log.error("event=oplog_fell_off resume_ts=%s first_ts=%s action=resync_from_messages",
                      self.last_ts, first[0]["ts"])
        return cursor["id"], first

    def _seen(self, entries: list[dict]) -> Batch:
        self.last_ts = entries[-1]["ts"]
        self.last_activity = time.monotonic()
        return Batch(entries)

    async def batches(self) -> AsyncIterator[OplogEvent]:
        backoff = Backoff()
        while True:
            reraise_if_cancelling()  # a cancel the driver took for its own error ends the tail here
            cursor_id = 0
            try:
                cursor_id, first = await self._open()
                if self._suspect:
                    self._suspect = False
                    self.restarts += 1
                    yield Restarted()
                if first:
                    yield self._seen(first)
                opened = time.monotonic()
                while cursor_id:
                    reraise_if_cancelling()
                    more = {"getMore": cursor_id, "collection": "oplog.rs", "batchSize": self._batch}
                    if self.pace is not None:
                        await self._pause(self.pace.delay)
                    else:
                        more["maxTimeMS"] = self._await_ms
                    asked = time.perf_counter()
                    reply = await self._local.command(more)
                    GETMORE.observe(time.perf_counter() - asked)
                    cursor_id = reply["cursor"]["id"]
                    batch = reply["cursor"]["nextBatch"]
                    if self.pace is not None:
                        self._paced(batch)
                    if batch:
                        yield self._seen(batch)
                        backoff.reset()
                    elif time.monotonic() - max(self.last_activity, opened) > self._silence:
                        log.info("event=oplog_watchdog silent_s=%.0f action=reopen", self._silence)
                        self._suspect = True
                        break
                if not cursor_id:
                    # The server closed the cursor (an empty capped collection
                    # does that): re-open soon, but never in a tight loop.
                    await asyncio.sleep(REOPEN_PAUSE)
            except PyMongoError as exc:
                reraise_if_cancelling()
                self._suspect = True
                delay = backoff.next()
                log.warning("event=oplog_error error=%s detail=%r retry_in_s=%.2f",
                            exc.__class__.__name__, str(exc)[-300:], delay)
                await asyncio.sleep(delay)
            finally:
                if cursor_id:
                    await self._kill(cursor_id)

    def _paced(self, batch: list[dict]) -> None:
        """A poll's outcome told to the pace; the quiet spell's two log lines."""
        assert self.pace is not None
        wait = self.pace.polled(bool(batch))
        if batch:
            self._idle = False
            if self._since_wake:  # found at the pace the wake gave back: the wake delivered these
                self._since_wake = False
                log.info("event=tail_wake_found entries=%d", len(batch))
        elif self.pace.backing_off and wait >= self.pace.idle_max and not self._idle:
            self._idle = True
            log.info("event=tail_idle poll_every_ms=%g", wait * 1000)

    def wake(self) -> None:
        """A write committed (``oplog.wake``): a polled tail that is backing off polls at once."""
        if self.pace is not None and self.pace.woken():
            WAKES.inc()
            log.info("event=tail_woken action=poll_now")
            self._idle, self._since_wake = False, True
            self._woken.set()

    async def _pause(self, seconds: float) -> None:
        """The wait before a poll: the base pace's plainly; a backoff's until it ends or a wake comes."""
        if self.pace is None or seconds <= self.pace.base:
            await asyncio.sleep(seconds)
            return
        self._woken.clear()
        try:
            async with asyncio.timeout(seconds):
                await self._woken.wait()
        except TimeoutError:
            self._since_wake = False  # a backoff ran out: what this poll finds is the timer's

    async def _kill(self, cursor_id: int) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the
        # result of a call that finished as the cancel came, and the cancel is lost.
        try:
            async with asyncio.timeout(1):
                await self._local.command({"killCursors": "oplog.rs", "cursors": [cursor_id]})
        except (PyMongoError, TimeoutError):
            reraise_if_cancelling()
