"""One daemon's serving state: its connections, WebSockets and waiting polls,
the hub and the stream, and the one way a client is subscribed to them.

The routes (``daemon.routes``, ``daemon.websocket``) and the lifecycle
(``daemon.lifecycle``) work on a ``Daemon``; connections never see it, only
its ``ServerState`` and its handler (``daemon.routes.Router``).

A daemon serves some partitions of the slot map (all of them by default):
one stream and one hub each. A client of another partition is refused with
421 and its partition (``daemon.partitioning``); a client's cursor is a
position in its own partition's stream. Every such decision reads the map
the daemon holds now (``maps``), which a move replaces (``daemon.handover``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Literal

from chat.errors import ChatError
from chat.partitions import SlotMap
from chat.settings import Settings
from daemon import admission, metrics
from db.conversation_state import UnreadTotals
from daemon.catchup import CatchUp
from daemon.connection import Connection, ServerState
from daemon.heartbeat_wheel import DueWheel
from daemon.hub import Hub, Hubs, Subscriber
from chat.partitions import LiveMap
from daemon.partitioning import cursor_text, resume_since, wrong_partition
from daemon.signals import Signals
from daemon.stream import Stream
from writer.client import RemoteWriter

FUTURE_SINCE_WAIT = 2.0  # a `since` from a daemon that is ahead of this one
# Routed by user: how long a user's first socket waits for the relay to serve the user
# (its marker, behind what the relay and the stream hold queued); past it, the client retries.
HOLD_WAIT = 10.0
# Heartbeat buckets a quarter of a tick wide: a socket visited before its due
# time (it shares a bucket with the tick's time) is one in eight, not one in two.
BUCKETS_PER_TICK = 4


def heartbeat_tick(settings: Settings) -> float:
    """How often the heartbeat looks for due WebSockets: often enough that a
    ping, a pong's deadline or a token's `exp` is acted on within a second."""
    return max(0.1, min(1.0, settings.daemon.ping_interval_seconds / 4, settings.daemon.ping_timeout_seconds / 4))


class Behind(ChatError):
    """This daemon cannot serve the client yet: the client retries (1013, or
    503 to a poll), here or elsewhere. ``reason`` labels
    ``chat_daemon_rejects_total``: ``behind``, the daemon has not reached the
    client's ``since``; ``no_marker``, routed by user, the relay's marker for
    the user's first socket did not come within ``HOLD_WAIT``."""

    def __init__(self, reason: Literal["behind", "no_marker"] = "behind"):
        super().__init__(reason)
        self.reason = reason


POLL_SIGNALS_MAX = 100  # typing events one poll answer carries at most: past it, they are dropped


class PollWaiter:
    """A long-poll: collects what its subscriber sends until the answer goes out."""

    __slots__ = ("subscriber", "items", "signals", "wake")

    def __init__(self, user: str, since: int, partition: int = 0):
        self.subscriber = Subscriber(self, user, since, partition)
        self.items: list[tuple[int, bytes]] = []
        self.signals: list[bytes] = []  # typing events that came while it waited (its answer's `signals`)
        self.wake = asyncio.Event()

    def send(self, msg_id: int, payload: bytes, frame: bytes | None) -> None:
        self.items.append((msg_id, payload))
        self.wake.set()

    def signal(self, payload: bytes) -> None:
        if len(self.signals) < POLL_SIGNALS_MAX:
            self.signals.append(payload)
        self.wake.set()

    def overflow(self) -> None:
        self.wake.set()  # answer with the gap-free prefix it holds; the cursor resumes there


# How long a hello or a poll answer waits for the unread count: past it, `unread` is null. A
# MySQL that is slow must not hold a client's connection or its messages back by more.
UNREAD_WAIT_SECONDS = 0.5


class Daemon:
    def __init__(self, settings: Settings, hub: Hub | Hubs, stream: Stream | None, *,
                 streams: dict[int, Stream] | None = None, maps: LiveMap | None = None,
                 writer: RemoteWriter | None = None, unread: UnreadTotals | None = None,
                 signals: Signals | None = None):
        """``hub`` and ``stream``: the single stream's, or, with ``streams`` (by
        partition), the hubs of those partitions and the first one's stream;
        ``maps``: the slot map it decides by (one partition when absent)."""
        self.settings = settings
        self.state = ServerState(settings)  # what its connections share: the cap, the drain, the idle sweep
        self.hub = hub if isinstance(hub, Hubs) else Hubs({0: hub})
        self.streams: dict[int, Stream] = streams if streams is not None else (
            {} if stream is None else {0: stream})
        self.stream = stream  # the first served partition's: /healthz's position
        self.maps = maps or LiveMap(SlotMap.even(1))
        self.served = frozenset(self.hub.by_partition)
        self.sockets: set[Connection] = set()  # the WebSockets among the connections, for heartbeats
        self.heartbeat_tick = heartbeat_tick(settings)
        # The WebSockets by the time their heartbeat is next due; closed ones are dropped as they come out.
        self.due: DueWheel[Connection] = DueWheel(self.heartbeat_tick / BUCKETS_PER_TICK)
        self.polls: set[PollWaiter] = set()
        self.writer = writer  # the host's writer: where clients' acks and read markers go (None: refused)
        self._unread = unread  # None: no MySQL, and `unread` is null
        self.signals = signals  # typing and presence; None: no Redis (CHAT_REDIS_URL empty)
        # Routed by user: the subscribers whose user their stream holds (``Stream.hold``), until ``unsubscribe``.
        self._holding: set[Subscriber] = set()

    @property
    def slot_map(self) -> SlotMap:
        return self.maps.current

    @property
    def draining(self) -> bool:
        return self.state.draining

    def admit(self, token: str | None, origin: str | None) -> tuple[str, float]:
        """The user and the token's ``exp``, or ``chat.errors.Refused`` (``daemon.admission.admit``)."""
        accepting = not self.state.draining and self.ready
        return admission.admit(self.settings, token, origin, open_connections=len(self.state.conns),
                               accepting=accepting)

    def admit_connection(self, origin: str | None) -> None:
        """A handshake's checks that need no token: its origin and the daemon's room (or ``Refused``)."""
        accepting = not self.state.draining and self.ready
        admission.admit_connection(self.settings, origin, open_connections=len(self.state.conns), accepting=accepting)

    def verify(self, token: str | None) -> tuple[str, float]:
        """The user and ``exp`` of a token sent after the upgrade, or ``Refused`` 401."""
        return admission.verify(self.settings, token)

    @property
    def ready(self) -> bool:
        """Its streams are read, and its typing channels subscribed to (or tried once: Redis away)."""
        return (all(stream.ready.is_set() for stream in self.streams.values())
                and (self.signals is None or self.signals.subscribed_once.is_set()))

    def partition_of(self, user: str, asked: str | None) -> int:
        """The user's partition, if this daemon serves it (and ``asked``, the
        request's ``partition`` parameter, is absent or names it); else
        ``chat.errors.Refused`` 421 with the user's partition."""
        partition = self.slot_map.partition_of(user)
        refused = wrong_partition(partition, self.served, asked)
        if refused is not None:
            metrics.REJECTS.labels("wrong_partition").inc()
            raise refused
        return partition

    def still_serves(self, user: str, partition: int) -> bool:
        """Whether ``partition``, decided for ``user`` before an await, is still the user's
        by the map held now: a slot that moved meanwhile must not join the old partition's hub,
        where the hand-over that closed the others' sockets would never reach it."""
        return self.slot_map.partition_of(user) == partition

    def serve_more(self, streams: dict[int, Stream], hubs: dict[int, Hub]) -> None:
        """Serves the partitions of ``streams`` too, each ready, with its hub: a
        grown map's (``daemon.handover``). Their users are refused with 421 until then."""
        self.hub.by_partition.update(hubs)
        self.streams.update(streams)
        self.served = frozenset(self.hub.by_partition)
        if self.signals is not None:
            self.signals.partitions_changed()

    def resume_point(self, raw_since: str | None, user: str) -> int | None:
        """Where ``since`` resumes in the user's partition; None: ``recovered: false``."""
        return resume_since(raw_since, user, self.slot_map)

    async def unread(self, user: str, partition: int) -> int | None:
        """The user's unread total for a hello or a poll answer; None when MySQL does not say within its timeout."""
        if self._unread is None:
            return None
        wait = min(self.settings.stores.db_timeout_seconds, UNREAD_WAIT_SECONDS)
        return await self._unread.total(user, partition, wait)

    def cursor(self, partition: int, position: int) -> str:
        """A cursor at ``position`` of ``partition``: a bare id for the single stream at epoch 0."""
        return cursor_text(partition, self.slot_map.epoch, position)

    async def subscribe(self, sub: Subscriber, since: int | None, most: int | None = None,
                        max_bytes: int | None = None) -> tuple[AsyncGenerator[CatchUp, None], int]:
        """Registers ``sub``; returns its catch-up, in pages of at most ``most``
        messages and ``max_bytes`` of payload, and the cursor.

        The stream position is read and the subscriber registered with no
        await in between: catch-up covers (since, position], live frames the rest.
        Routed by user, the stream first holds the user, until the relay's
        marker for it, and then joins it: every entry of the user past that
        position reaches the stream whole (``Stream.hold``, ``Stream.join``).
        """
        stream = self.streams[sub.partition]
        if stream.by_user:
            self._holding.add(sub)
            served = await stream.hold(sub.user, HOLD_WAIT)
            if sub not in self._holding:  # gone while it waited (``unsubscribe``): nothing to register
                return _one(CatchUp(False, [])), stream.position
            if not served:
                self.unsubscribe(sub)
                raise Behind("no_marker")
            stream.join(sub.user)  # no await from here to the register
        position = stream.position
        sub.last_id = since if since is not None else position
        self.hub.register(sub)
        if since is None:
            return _one(CatchUp(False, [])), position
        if since > position and not await stream.wait_for(since, FUTURE_SINCE_WAIT):
            if await stream.is_stored(since):
                # The client saw more than this daemon has (it came from one
                # further along). Not "recovered: false", which would send it to
                # reload history: it retries, here or elsewhere, with this since.
                self.unsubscribe(sub)
                raise Behind()
            sub.last_id = position  # no message has that id: serve from here
            return _one(CatchUp(False, [])), position
        return stream.pages(sub.user, since, position, most, max_bytes), max(position, since)

    def unsubscribe(self, sub: Subscriber) -> None:
        """``sub`` is done: out of its hub, and its user let go if it was the last (routed by user)."""
        self.hub.unregister(sub)
        if sub in self._holding:
            self._holding.discard(sub)
            if (stream := self.streams.get(sub.partition)) is not None:
                stream.release(sub.user)

    def join(self, conn: Connection) -> None:
        """A new WebSocket: among the sockets, due for its heartbeat at its first ping (or token expiry)."""
        self.sockets.add(conn)
        self.due.schedule(conn, conn.next_due())
        if self.signals is not None:
            self.signals.arrive(conn.subscriber.user)

    def forget(self, conn: Connection) -> None:
        """A WebSocket is gone (closed either way); idempotent."""
        if conn in self.sockets:
            self.sockets.discard(conn)
            self.unsubscribe(conn.subscriber)
            conn.subscriber.detach()
            metrics.WS_OPEN.dec()
            if self.signals is not None:
                self.signals.leave(conn.subscriber.user)


async def _one(page: CatchUp) -> AsyncGenerator[CatchUp, None]:
    yield page
