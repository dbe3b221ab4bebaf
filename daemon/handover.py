"""A daemon on a new slot map: it keeps running, and hands over only the
clients of the users whose slot moved.

A move (``chatctl partitions``) cuts over under the writer locks of the
partitions involved: it writes the new map (its epoch one higher, each moved
slot marked with it), and from then on the old partition's writer commits
nothing more for the moved users; all it committed for them before is in
that partition's MySQL table. A daemon sees the new map at its next look
(``daemon.partition_streams.next_map``, every ``CHAT_GAP_CHECK_SECONDS``),
and then, for each partition it serves:

1. It reads the partition's committed head from MySQL (after seeing the
   map, so the head covers every row of a moved user) and waits until its
   stream has released up to it, asking for a read of MySQL at once should
   the oplog lag: what was committed before the cutover reaches the sockets
   still open. The wait is bounded (``release_bound``); past it the daemon
   logs ``event=handover_release_incomplete`` and goes on, as a drain would.
2. It swaps the new map in (``chat.partitions.LiveMap``: the 421s,
   resumes, cursors and typing channels all read it) and, with no await in
   between, closes with 1012 the WebSockets of the users whose slot moved
   and answers their waiting long-polls at once, as a drain does
   (``daemon.partitioning.handed_over`` decides who). Nothing else is
   closed. A moved user reconnects to its new partition's daemons (a daemon
   of the old one answers 421 and the partition), where its old cursor gets
   ``recovered: false``. A client whose partition was decided before the
   swap and that registers after it is closed the same way
   (``Daemon.still_serves``).

A new map that gives the daemon partitions to serve that it has no stream
for (``CHAT_DAEMON_PARTITIONS`` empty, after a grow) is followed in place
too. The daemon's streams share one oplog source whose namespaces are fixed
when it is made (``oplog.fanout``, ``relay.client.RelayTail``), so the new
partitions get one of their own (``daemon.partition_streams.extend``): a
second relay connection, or a second tail of the oplog without the relay,
until the daemon restarts. They are built and started while step 1 runs,
and served, their typing channels listened to, in the same step as the
swap: a moved user who reconnects finds its new partition served. Only when
they cannot be built (a daemon fed a recorded oplog), or are not ready
within ``build_bound`` (a tail's silence watchdog, 30 s by default), does
the daemon restart instead: after steps 1 and
2, it stops as on SIGTERM (every other client closed with 1012), exits with
status 0, and supervisord starts it on the new map.

Each new map is logged once, as ``event=slot_map_moved epoch=.. new_epoch=..
moved_users_closed=N sockets=.. polls=.. action=handed_over`` (or
``action=restart``), with ``new_partitions=..`` when it added some.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from chat.errors import CloseCode
from chat.partitions import SlotMap
from chat.settings import Settings
from daemon import metrics
from daemon.partition_streams import Partitions, next_map
from daemon.partitioning import frame_encoder, handed_over, partitions_to_add
from daemon.server import Daemon
from daemon.stream import Stream
from daemon.websocket import SLOT_MOVED

log = logging.getLogger("chat.daemon")

HEAD_RETRY_SECONDS = 0.2  # MySQL did not say its committed head: asked again after this, within the bound


def build_bound(settings: Settings) -> float:
    """How long a hand-over waits for the streams of partitions new to the daemon before it
    restarts instead: as long as a tail may stay silent before its watchdog restarts it. Waiting
    costs only the moved users (served on the old map meanwhile; their new partition's history
    holds what they miss, and their reconnect is told `recovered: false`); a restart closes every
    client, and its streams start from the same slow store. Measured on a grow 4 -> 8 with
    FerretDB 20 s behind: with a bound of 3 s, 5 of 6 daemons restarted and the last moved
    device was back 28.8 s after the cutover."""
    return max(release_bound(settings), settings.tail.silence_seconds)


def release_bound(settings: Settings) -> float:
    """How long a hand-over waits for its streams: a drain's grace at least,
    and three gap checks, within two of which the stream reads from MySQL
    what the oplog never showed."""
    return max(settings.daemon.drain_seconds, 3 * settings.daemon.gap_check_seconds)


@dataclass(frozen=True, slots=True)
class HandedOver:
    users: int  # users whose slot moved, with a client here
    sockets: int  # their WebSockets, closed with 1012
    polls: int  # their waiting long-polls, answered


async def release_committed(streams: dict[int, Stream], bound: float) -> list[int]:
    """Waits until each stream has released what its partition's MySQL has
    committed now, ``bound`` seconds at most; returns the partitions whose
    stream did not get there."""
    reached = await asyncio.gather(*(_release(k, stream, bound) for k, stream in streams.items()))
    return [k for k, done in zip(streams, reached, strict=True) if not done]


async def _release(partition: int, stream: Stream, bound: float) -> bool:
    head = None
    try:
        async with asyncio.timeout(bound):
            while (head := await stream.truth.read_committed()) is None:
                await asyncio.sleep(HEAD_RETRY_SECONDS)  # a failed read is logged by the reader
            if head > stream.position:
                stream.inbox.request_fill()  # from MySQL now, not at the gap check: the oplog may lag
            if not await stream.wait_for(head, bound):
                raise TimeoutError
        return True
    except TimeoutError:
        log.warning("event=handover_release_incomplete partition=%d position=%d committed=%s waited_s=%g",
                    partition, stream.position, "unknown" if head is None else head, bound)
        return False


def hand_over(daemon: Daemon, new: SlotMap) -> HandedOver:
    """Swaps ``new`` in and closes the clients of the users whose slot moved
    (the module's step 2). No await: nobody registers on the old map after it."""
    old, sockets, polls = daemon.slot_map, list(daemon.sockets), list(daemon.polls)
    connected = {conn.subscriber.user for conn in sockets} | {waiter.subscriber.user for waiter in polls}
    moved = handed_over(old, new, daemon.served, connected)
    daemon.maps.current = new
    for partition, stream in daemon.streams.items():
        stream.use_encoder(frame_encoder(partition, new))  # the new epoch in the cursors from now on
    closed = answered = 0
    for conn in sockets:
        if conn.subscriber.user in moved:
            metrics.CLOSES.labels("slot_moved").inc()
            conn.close(CloseCode.RESTART, SLOT_MOVED)
            closed += 1
    for waiter in polls:
        if waiter.subscriber.user in moved:
            waiter.wake.set()  # answered now with what it holds; its cursor no longer resumes
            answered += 1
    return HandedOver(len(moved), closed, answered)


Grow = Callable[[frozenset[int], SlotMap], Awaitable[Partitions]]


async def follow(daemon: Daemon, engine: Engine, settings: Settings, grow: Grow | None = None) -> SlotMap:
    """For the life of the daemon: each new map MySQL holds is handed over
    to. ``grow(partitions, map)``: the started streams of partitions the
    daemon is to serve too, once each is ready (None: it cannot, and
    restarts instead). Returns the first map the daemon cannot follow in
    place: it then restarts."""
    bound = release_bound(settings)
    build = build_bound(settings)
    while True:
        new = await next_map(engine, daemon.slot_map.epoch, settings.daemon.gap_check_seconds)
        epoch = daemon.slot_map.epoch
        lacking = partitions_to_add(settings.daemon.partitions, daemon.served, new)
        _, built = await asyncio.gather(release_committed(daemon.streams, bound),
                                        _built(grow, lacking, new, build))
        # From here to the log line, no await: the new partitions are served, and the moved users
        # closed, in one step on one map.
        if built is not None:
            daemon.serve_more(built.streams, built.hubs.by_partition)
        done = hand_over(daemon, new)
        restart = bool(lacking) and built is None
        action = "restart" if restart else "handed_over"
        if lacking:
            action += f" new_partitions={','.join(map(str, sorted(lacking)))}"
        log.warning("event=slot_map_moved epoch=%d new_epoch=%d moved_users_closed=%d sockets=%d polls=%d action=%s",
                    epoch, new.epoch, done.users, done.sockets, done.polls, action)
        if restart:
            return new


async def _built(grow: Grow | None, partitions: frozenset[int], new: SlotMap, bound: float) -> Partitions | None:
    """The streams of ``partitions``, ready within ``bound`` seconds; None if there are none to build, or
    none can be (the daemon restarts then)."""
    if not partitions or grow is None:
        return None
    try:
        async with asyncio.timeout(bound):
            return await grow(partitions, new)
    except TimeoutError:
        log.warning("event=partitions_not_ready partitions=%s waited_s=%g action=restart",
                    ",".join(map(str, sorted(partitions))), bound)
        return None
