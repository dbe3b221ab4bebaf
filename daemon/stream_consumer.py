"""The consumer of a partition's stream: takes the oplog's batches from the
inbox (``daemon.tail_reader``) and applies them. The sequencer puts ids in
order and holds what comes after a hole or past what MySQL has confirmed;
what it releases goes into the recent cache and to the partition's hub.
What is held waits for the stream's reader of the truth
(``daemon.stream_fills``), whose reads are released through here too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from chat.messages import REVISIONS, Encoded, inserted_docs, is_message_doc
from chat.stopping import reraise_if_cancelling
from daemon import metrics
from daemon.hub import Hub
from daemon.recent_cache import RecentCache
from daemon.sequencer import Sequencer
from daemon.passed import Passed, blank, merged, passed_over
from daemon.tail_reader import FillRequest, ConsumerInbox, Item
from daemon.wire import text_frame
from oplog.events import Batch, Subscribed

log = logging.getLogger("chat.stream")

CONFIRM_MAX = 5000  # held documents past which the consumer stops taking batches and reads the truth


def admit(docs: list[dict], source: str) -> list[dict]:
    """The documents in the writer's shape; the rest is logged, counted and
    skipped (chat.messages.is_message_doc), never a crash of the stream."""
    good = [d for d in docs if is_message_doc(d)]
    if len(good) != len(docs):
        reject("shape", source, [d.get("_id") for d in docs if not is_message_doc(d)])
    return good


def _is_passed(doc: dict) -> bool:
    return type(doc) is Passed


def reject(reason: str, source: str, ids: list, action: str = "skipped") -> None:
    metrics.STRAYS.labels(reason).inc(len(ids))
    log.error("event=stray_document reason=%s source=%s count=%d ids=%.200r action=%s "
              "meaning=a_document_the_writer_did_not_write", reason, source, len(ids), ids[:5], action)


class Consumer:
    """Owns the stream's position (the sequencer's ``high``, the highest id
    released) and the one way documents go out (``release``)."""

    def __init__(self, hub: Hub, cache: RecentCache, namespace: str, *, encode: Callable[[dict], Encoded],
                 partition: int, primary: bool, checked_by_mysql: bool):
        """``checked_by_mysql``: nothing is released past what MySQL confirmed
        (the sequencer's bound); ``primary``: the position and the lag are the
        daemon's unlabelled gauges too."""
        self.hub = hub
        self._cache = cache
        self._namespace = namespace
        self._encode = encode
        self._primary = primary
        self._checked = checked_by_mysql
        label = str(partition)
        self._decoded = metrics.OPLOG_DECODED.labels(label)
        self._passed = metrics.OPLOG_PASSED.labels(label)
        # The highest id offered to the sequencer: where a relay's marker stands (daemon/interest.py).
        self.seen = 0
        # The highest id the oplog has shown (a document, or an id passed over): ids reach
        # the fast store in id order (docs/design.md §1), so it holds every id up to this
        # one. Ids released past it came from MySQL, and the fast store may lack them yet
        # (a writer's outbox): a catch-up reads them from the truth (``daemon.stream.Stream.pages``).
        self.shown = 0
        # What a relay's marker is handed to (``Stream``, routed by user): (its token, ``seen``).
        self.on_subscribed: Callable[[int, int], None] | None = None
        self._position_gauge = metrics.PARTITION_POSITION.labels(label)
        self._lag_gauge = metrics.PARTITION_TAIL_LAG.labels(label)
        self.seq = self._sequencer(0)  # the reader of the truth settles what it holds
        self._advanced = asyncio.Event()  # set and replaced each time the position moves
        self._lag, self._moved_at = 0.0, time.monotonic()  # for the tail-lag gauge
        # When the oldest batch whose documents wait for the truth arrived (oplog -> socket counts the wait).
        self._waiting_since: float | None = None

    def _sequencer(self, high: int) -> Sequencer:
        """With MySQL, nothing past ``high`` is released until MySQL confirms it."""
        return Sequencer(high=high, bound=high if self._checked else None)

    def start_at(self, high: int, stored: int = 0) -> None:
        """The position the stream's start read: every id up to ``high`` counts as released;
        ``stored``: an id the fast store holds, with every id before it (``shown``)."""
        self.seq = self._sequencer(high)
        self.seen = max(self.seen, high)
        self.shown = max(self.shown, stored)

    @property
    def position(self) -> int:
        return self.seq.high

    def use_encoder(self, encode: Callable[[dict], Encoded]) -> None:
        self._encode = encode

    async def run(self, inbox: ConsumerInbox, fill: Callable[[bool], Awaitable[None]]) -> None:
        """Takes the inbox for the life of the stream; ``fill(ahead)`` reads the
        truth for what is held (``ahead``: and for what MySQL has past it)."""
        while True:
            # A cancel that landed in a driver call may come back as a plain
            # return (PyMongo finishes some cancelled operations): the loop
            # must still end, or a shutdown waits for it for ever.
            reraise_if_cancelling()
            item, received = await inbox.get()
            ahead = self._step(item, received)
            if self.seq.hole:
                # Documents wait for the truth: whatever else has come meanwhile
                # joins them, so that one read of MySQL settles them all.
                while not inbox.empty() and self.seq.held < CONFIRM_MAX:
                    ahead = self._step(*inbox.get_nowait()) or ahead
            if ahead or self.seq.hole:
                await fill(ahead)
            if not self.seq.hole:
                self._waiting_since = None

    def _step(self, item: Item, received: float) -> bool:
        """Takes one item of the inbox; True: it asks for a read of the truth."""
        if isinstance(item, FillRequest):
            return True
        if isinstance(item, Subscribed):
            if self.on_subscribed is not None:
                self.on_subscribed(item.token, self.seen)
            return False
        self.take(item, received)
        if self._waiting_since is None and self.seq.hole:
            self._waiting_since = received
        return False

    def take(self, batch: Batch, received: float) -> None:
        """One oplog batch, without I/O: what is next in the stream goes out now,
        what comes after a hole is held (loadtest/hotpath.py times this)."""
        entries = batch.entries
        docs = admit([d for entry in entries for d in inserted_docs(entry, self._namespace)], "oplog")
        metrics.OPLOG_ENTRIES.inc(len(entries))
        self._decoded.inc(len(entries))
        if batch.passed:  # routed by user: the ids of the others' documents, in the order's place of them
            passed = passed_over(batch.passed)
            self._passed.inc(len(passed))
            docs = merged(docs, passed)
        if docs:
            last = docs[-1]["_id"]
            if last > self.seen:
                self.seen = last
            if last > self.shown:
                self.shown = last
            self.release(self.seq.offer(docs), received)

    def release(self, docs: list[dict], received: float) -> None:
        if not docs:
            return
        pushes = 0
        newest = None
        for doc in docs:
            if type(doc) is Passed:
                self._cache.append(blank(doc["_id"]))  # for none of this daemon's users
                continue
            newest = doc
            encoded = self._encode(doc)
            self._cache.append(encoded)
            if doc.get("kind") in REVISIONS:
                self._cache.revise(doc)
            msg_id, sender, recipient, _, payload = encoded
            delivered = self.hub.dispatch(msg_id, sender, recipient, payload, text_frame)
            if delivered:
                pushes += delivered
                # dispatch wrote to every socket before returning: this is oplog -> socket
                metrics.OPLOG_TO_SOCKET.observe(time.perf_counter() - received)
        metrics.PUSHES.inc(pushes)
        self._position_gauge.set(self.position)
        if self._primary:
            metrics.POSITION.set(self.position)
        if newest is not None:
            self._lag = max(0.0, time.time() - newest["created_at"].timestamp())
        self._moved_at = time.monotonic()
        self._set_lag(self._lag)
        self._notify()

    def drop_above(self, bound: int) -> list[int]:
        """Forgets held documents past ``bound`` (``Sequencer.drop_above``); returns their ids."""
        return self.seq.drop_above(bound)

    def unpass(self, upto: int) -> list[int]:
        """Forgets the ids passed over up to ``upto`` that are still held: each
        is a hole again, which only a whole document fills (the relay's, once
        it serves the user, or the stores'). Returns them; the caller asks for
        the read. Why: ``daemon.stream.Stream.join``."""
        return self.seq.forget(upto, _is_passed)

    def release_held(self, docs: list[dict]) -> None:
        """Releases documents that waited for the truth: oplog -> socket counts from when the wait began."""
        self.release(docs, self._waiting_since or time.perf_counter())

    def skip_to(self, upto: int) -> None:
        """Ids up to ``upto`` are gone for good (expired or deleted): the position moves past them."""
        log.error("event=stream_skip after=%d upto=%d reason=expired_or_deleted", self.position, upto)
        self._cache.clear()  # it must stay contiguous
        self.release(self.seq.skip_to(upto), time.perf_counter())

    def note_stuck(self) -> None:
        """Messages wait and the position does not move: the lag keeps growing
        even though nothing is released to measure it by."""
        self._set_lag(max(self._lag, time.monotonic() - self._moved_at))

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
