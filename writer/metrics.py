"""Prometheus metrics of the writer: its group commits, its way into Mongo, its outbox.

The host's writer process serves them on its own metrics port. An API process
that writes for itself (``CHAT_WRITER_SOCKET`` empty) serves them beside its
own ``chat_api_*``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from chat import gcpauses
from chat.messages import Message
from chat.loop_histogram import LoopHistogram

BATCH_SIZE = Histogram("chat_writer_batch_messages", "Messages per group commit",
                       buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
BATCH_SECONDS = Histogram("chat_writer_batch_seconds", "Time of one group commit, from its first request taken to "
                          "its answers (MySQL; the Mongo insert follows)",
                          buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
# Observed on the event loop for each batch's messages at once (LoopHistogram: no lock, a count).
MONGO_LAG = LoopHistogram("chat_writer_mongo_lag_seconds", "Per message, from its created_at stamp (just before its "
                          "MySQL INSERT) to the return of the Mongo insert that holds it: the commit, the wait for "
                          "the insert ahead, its own insert",
                          buckets=(.0025, .005, .0075, .01, .015, .02, .025, .03, .04, .05, .075, .1, .15, .25, .5, 1,
                                   2.5))
MONGO_INSERT = LoopHistogram("chat_writer_mongo_insert_seconds", "One insert into the fast store that it answered "
                             "(a batch's, or an outbox page's), from sent to answered: what the hand-over grace "
                             "follows", buckets=(.0025, .005, .01, .02, .03, .05, .075, .1, .15, .25, .5, 1, 2.5))
# Per partition: each has its own outbox, in its own collection.
TURN_SECONDS = Histogram("chat_writer_turn_seconds", "A partition writer's turn: `waiting` for the partition's "
                         "lock (GET_LOCK, from the turn's start), then `holding` it (every batch of the turn, each "
                         "Mongo insert the turn waits for, to RELEASE_LOCK). Every host's writers take turns of "
                         "the same lock: its holding time is what the others wait", ["phase"],
                         buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
OUTBOX_MESSAGES = Gauge("chat_writer_outbox_messages", "Messages committed to MySQL that the fast store does not "
                        "hold yet (the outbox), as of the partition writer's last turn", ["partition"])
OUTBOX_AGE = Gauge("chat_writer_outbox_age_seconds", "Age of the oldest message in the partition's outbox (0: "
                   "empty). Past 10 s the writer also logs event=outbox_aging; the daemons deliver those messages "
                   "from MySQL meanwhile", ["partition"])
STRAYS = Counter("chat_writer_stray_documents", "Documents found at ids the partition's writer committed that it "
                 "did not write (a duplicate _id that differs from the MySQL row), replaced by the row; also "
                 "logged as event=stray_document source=writer", ["partition"])
COPIES = Counter("chat_writer_copies", "Copies committed in the partition of their recipient, of messages sent "
                 "from another partition", ["partition"])
# What a message between partitions waits, past its original, before its recipient's partition holds it:
# the second commit of its path, which its recipient's devices wait for and its sender's do not.
COPY_LAG = LoopHistogram("chat_writer_copy_lag_seconds", "Per copy, from its original's created_at stamp (taken by "
                         "the original's writer just before its INSERT) to the copy's commit in its recipient's "
                         "partition: the original's commit, the hand-over or the leader's wake and read of the "
                         "echoes, its queue, turn and commit. Between hosts it includes their clocks' difference",
                         buckets=(.005, .01, .02, .03, .04, .05, .075, .1, .15, .25, .5, 1, 2.5, 5, 10))
GC_PAUSES = Histogram("chat_writer_gc_pause_seconds", "Cyclic garbage collector passes of the writer process, by "
                      "generation: no request is read or answered meanwhile", ["generation"], buckets=gcpauses.BUCKETS)


def watch_gc() -> None:
    """The writer process's GC pauses (an API process times its own, as chat_api_gc_pause_seconds)."""
    gcpauses.watch(GC_PAUSES)


def outbox_observer(partition: int) -> Callable[[int, float], None]:
    """(messages, age of the oldest in seconds) of one partition's outbox, after each of its turns."""
    messages, age = OUTBOX_MESSAGES.labels(str(partition)), OUTBOX_AGE.labels(str(partition))

    def observe(size: int, age_seconds: float) -> None:
        messages.set(size)
        age.set(age_seconds)

    return observe


def copies_observer(partition: int, lag: LoopHistogram = COPY_LAG,
                    clock: Callable[[], float] = time.time) -> Callable[[list[Message]], None]:
    """The copies each commit of ``partition`` made: counted, and each one's lag behind its original's stamp."""
    count = COPIES.labels(str(partition)).inc

    def observe(copies: list[Message]) -> None:
        if copies:
            count(len(copies))
            now = clock()
            for copy in copies:
                lag.observe(max(0.0, now - copy.created_at.timestamp()))

    return observe


def strays_observer(partition: int) -> Callable[[int], None]:
    return STRAYS.labels(str(partition)).inc


def observe_turn(waiting: float, holding: float) -> None:
    TURN_SECONDS.labels("waiting").observe(waiting)
    TURN_SECONDS.labels("holding").observe(holding)


def observe_batch(size: int, seconds: float) -> None:
    BATCH_SIZE.observe(size)
    BATCH_SECONDS.observe(seconds)
