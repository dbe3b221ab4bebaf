"""A daemon's typing and presence (docs/presence.md): the I/O shell around
``daemon.presence``, between the daemon's connections and Redis.

It runs beside the streams and never in their way: its own Redis clients,
its own tasks, bounded queues, and every Redis failure caught here. A daemon
whose Redis is away delivers messages as before; its clients' typing and
watch frames get ``signals_unavailable``, and once Redis is back the daemon
puts its users back (``_resync``).

Tasks: ``_listen`` (one pub/sub connection: the typing channels of the partitions served, and the
presence channel of each user a connection here watches, subscribed and let go as the watch lists
change, ``daemon.subscriptions``), ``_flush`` (announcements and withdrawals, in order, one pipeline
per batch), ``_publish`` (typing, one pipeline per batch), and ``_tick``
(the graces, the heartbeat, the sweep of dead daemons, ``last_seen`` into MySQL).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from chat.messages import rfc3339
from chat.settings import Settings
from chat.signal_store import PRESENCE_PREFIX, REDIS_ERRORS, SignalStore, presence_channel, typing_channel
from daemon import metrics
from daemon.hub import Hubs
from chat.partitions import LiveMap
from daemon.presence import PresenceTracker, Watchers
from daemon.subscriptions import Subscriptions, commands
from db import presence as presence_sql
from db.threads import Threads

log = logging.getLogger("chat.daemon")

TICK_SECONDS = 0.25  # how often graces are checked: a user goes offline within a quarter second of its end
HEARTBEAT_SECONDS = 2.0  # a daemon's heartbeat into Redis; the sweep of dead ones runs as often
STORE_SECONDS = 1.0  # last_seen goes to MySQL in one statement at most this often
CHANGES_BATCH = 500  # announcements and withdrawals in one pipeline
TYPING_QUEUE_MAX = 10_000  # typing events waiting for Redis; past it (Redis slow) new ones are dropped
SWEEPS_PER_TICK = 20  # batches of dead daemons' users withdrawn per heartbeat
CHANNELS_PER_COMMAND = 1_000  # channels in one SUBSCRIBE or UNSUBSCRIBE: a resubscription of many is many commands
LISTEN_RETRY_SECONDS = 1.0  # after the pub/sub connection failed, its next try
_PRESENCE_PREFIX_BYTES = PRESENCE_PREFIX.encode()  # how redis-py hands a channel's name over
T = TypeVar("T")


class _TypingHeld:
    """A wait for the typing channels of the partitions served: on a new pub/sub connection,
    and after the daemon serves more partitions. Once held, the daemon says so in its log."""


class Watcher(Protocol):
    """What a watching connection is to the shell: where its presence frames go."""

    def signal(self, payload: bytes) -> None: ...

    def __hash__(self) -> int: ...


class Unavailable(Exception):
    """Typing or presence cannot be served: off here, or Redis is away. Its message is the error frame's."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def presence_frame(words: list[str]) -> bytes | None:
    """The client frame of a ``chat:presence:{user}`` payload (``chat.signal_store``); None if malformed."""
    if len(words) < 2 or words[0] not in ("0", "1"):
        return None
    online = words[0] == "1"
    last_seen = None
    if not online and len(words) > 2 and words[2].isdigit():
        last_seen = rfc3339(presence_sql.ms_to_datetime(int(words[2])))
    return orjson.dumps({"type": "presence", "user": words[1], "online": online, "last_seen": last_seen})


class Signals:
    def __init__(self, settings: Settings, store: SignalStore, listener: aioredis.Redis, hubs: Hubs,
                 maps: LiveMap, engine: Engine | None, *,
                 clock: Callable[[], float] = time.monotonic, wall_ms: Callable[[], int] = lambda: time.time_ns()
                 // 1_000_000, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep):
        self.settings = settings
        self.store = store
        self._listener = listener  # its own connection: a subscribed one can do nothing else
        self.hubs = hubs
        self.maps = maps  # the daemon's: a user's typing channel is its partition's by the map held now
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.presence = settings.signals.presence_enabled
        ttl = settings.signals.typing_ttl_seconds
        self._ttl: float | int = int(ttl) if ttl.is_integer() else ttl  # 5, not 5.0, for typed clients
        self.tracker = PresenceTracker(settings.signals.presence_grace_seconds)
        self.watchers: Watchers[Watcher] = Watchers()
        self._engine = engine  # None: no MySQL (development): last_seen is not stored
        self._threads = Threads(1, "presence")
        self._clock, self._wall_ms, self._sleep = clock, wall_ms, sleep
        self._changes: deque[tuple[str, int | None]] = deque()
        self._changes_ready = asyncio.Event()
        self._typing: deque[tuple[list[str], str]] = deque()
        self._typing_ready = asyncio.Event()
        self._seen: dict[str, int] = {}  # went offline, last seen (ms): for MySQL
        self._resync = True  # Redis must be told all this daemon's users (at start, and after it was away)
        # Set once the first subscription to the channels has been tried, done or failed: a daemon
        # is ready only then (else a typing event sent to its first clients could pass it by), and
        # never later for it (a Redis that is away must not keep messages from being served).
        self.subscribed_once = asyncio.Event()
        # The pub/sub connection's channels: the typing ones of the partitions served, and the presence
        # one of each watched user; ``_wanted`` says which, ``_channels`` what Redis holds of them.
        self._channels = Subscriptions()
        self._typing_channels: set[str] = set()
        self._plan_ready = asyncio.Event()  # channels were touched: the listener's sender plans and sends
        # Redis answered the last command. True from the start: a daemon just started serves typing
        # and watch frames at once, and learns that Redis is away from the first command that fails.
        self.healthy = True

    # --- from the connections -------------------------------------------------
    def arrive(self, user: str) -> None:
        if self.presence and self.tracker.arrive(user):
            self._change(user, None)

    def leave(self, user: str) -> None:
        if self.presence:
            self.tracker.leave(user, self._clock(), self._wall_ms())

    def forget(self, conn: Watcher) -> None:
        before = self.watchers.lists.get(conn, ())
        self.watchers.forget(conn)
        if before:
            self._touch([presence_channel(u) for u in before])

    def _touch(self, channels: list[str]) -> None:
        self._channels.touch(channels)
        self._plan_ready.set()

    async def _hold(self, channels: list[str]) -> None:
        """Returns once Redis has confirmed this daemon's subscription to each of ``channels``."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self._channels.wait(waiter, channels):
            return
        try:
            async with asyncio.timeout(self.settings.stores.db_timeout_seconds):
                await waiter
        except TimeoutError:
            raise Unavailable("signals_unavailable", "presence is unavailable for now: send the list again") from None
        finally:
            self._channels.drop(waiter)

    def typing(self, origin: int, sender: str, to: str, state: str) -> None:
        """Publishes a typing event (its gate has passed it); ``origin``: the typist's sink, not sent back to it."""
        if not self.healthy:
            raise Unavailable("signals_unavailable", "typing is unavailable: the daemon cannot reach Redis")
        if len(self._typing) >= TYPING_QUEUE_MAX:
            metrics.SIGNALS.labels("typing", "dropped").inc()
            return
        partition_of = self.maps.current.partition_of
        channels = {typing_channel(partition_of(to)), typing_channel(partition_of(sender))}
        self._typing.append((sorted(channels), f"{self.id}/{origin} {sender} {to} {state}"))
        self._typing_ready.set()

    async def watch(self, conn: Watcher, users: list[str]) -> bytes:
        """Replaces ``conn``'s watch list; returns the snapshot frame. Changes reach ``conn`` from now on."""
        if not self.presence:
            raise Unavailable("presence_disabled", "presence is turned off on this server")
        if not self.healthy:
            raise Unavailable("signals_unavailable", "presence is unavailable: the daemon cannot reach Redis")
        before = self.watchers.lists.get(conn, ())
        kept = list(self.watchers.watch(conn, users))
        self._touch([presence_channel(u) for u in (*before, *kept)])
        # The users' channels held first: a change published from then on reaches this daemon,
        # and so the client, after the snapshot or before it (when the snapshot shows it too).
        await self._hold([presence_channel(u) for u in kept])
        # MySQL first, Redis last, and the frame out with no wait after Redis: a change
        # published after that read reaches the client after this snapshot.
        rows = {} if self._engine is None or not kept else await self._mysql(presence_sql.rows_of, kept)
        try:
            online = await self.store.online(kept)
        except REDIS_ERRORS as exc:
            # One slow answer (a loop busy with a burst of watch frames) is not Redis gone:
            # the heartbeat decides that, and this client sends its list again.
            log.warning("event=presence_snapshot_failed error=%s", exc.__class__.__name__)
            raise Unavailable("signals_unavailable", "presence is unavailable for now: send the list again") from None
        return orjson.dumps({"type": "presence", "users": presence_sql.view(kept, online, rows)})

    def _change(self, user: str, last_seen: int | None) -> None:
        self._changes.append((user, last_seen))
        self._changes_ready.set()

    # --- running -----------------------------------------------------------------
    async def run(self) -> None:
        """For the life of the daemon: none of these ends but by cancellation."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._listen(), name="signals_listen")
            group.create_task(self._publish(), name="signals_publish")
            group.create_task(self._flush(), name="signals_flush")
            group.create_task(self._tick(), name="signals_tick")

    async def close(self) -> None:
        self._threads.close()
        await self.store.close()
        await self._listener.aclose()

    def _away(self, exc: BaseException) -> None:
        if self.healthy:
            log.warning("event=redis_unreachable action=signals_off error=%s detail=%r", exc.__class__.__name__,
                        str(exc)[-200:])
        self.healthy = False
        self._resync = True

    def _back(self) -> None:
        if not self.healthy:
            log.info("event=redis_reachable")
        self.healthy = True

    def partitions_changed(self) -> None:
        """The daemon serves more partitions (``daemon.handover``): their typing channels are listened to."""
        self._typing_channels = {typing_channel(p) for p in self.hubs.by_partition}
        self._touch(sorted(self._typing_channels))
        self._channels.wait(_TypingHeld(), self._typing_channels)

    def _wanted(self, channel: str) -> bool:
        if channel.startswith(PRESENCE_PREFIX):
            return channel[len(PRESENCE_PREFIX):] in self.watchers.by_user
        return channel in self._typing_channels

    async def _listen(self) -> None:
        """One pub/sub connection at a time, for the life of the daemon. A lost one is
        replaced after ``LISTEN_RETRY_SECONDS``, subscribed to every channel wanted then: the
        typing events and presence changes published meanwhile are lost, as any signal is
        whose listener is away (they are news of now, never replayed)."""
        self._typing_channels = {typing_channel(p) for p in self.hubs.by_partition}
        while True:
            pubsub = self._listener.pubsub()
            wanted = [*self._typing_channels, *map(presence_channel, self.watchers.by_user)]
            self._channels.reset(wanted)
            typing_held = _TypingHeld()
            try:
                await pubsub.connect()  # before anything is subscribed: the reader has a connection to read
                if not self._channels.wait(typing_held, self._typing_channels):
                    self._ended([typing_held])
                await self._send_plan(pubsub)
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._read(pubsub), name="signals_read")
                    group.create_task(self._send(pubsub), name="signals_subscribe")
            except* REDIS_ERRORS as errors:
                self._away(errors.exceptions[0])
                self.subscribed_once.set()  # tried once: a Redis that is away keeps no daemon from serving
            finally:
                self._channels.drop(typing_held)
                await pubsub.aclose()
            await self._sleep(LISTEN_RETRY_SECONDS)

    async def _send(self, pubsub: PubSub) -> None:
        while True:
            await self._plan_ready.wait()
            await self._send_plan(pubsub)

    async def _send_plan(self, pubsub: PubSub) -> None:
        """The SUBSCRIBEs and UNSUBSCRIBEs that make Redis hold the channels wanted now."""
        self._plan_ready.clear()
        subscribe, unsubscribe, over = self._channels.plan(self._wanted)
        self._ended(over)
        for channels in commands(unsubscribe, CHANNELS_PER_COMMAND):
            await pubsub.unsubscribe(*channels)
        for channels in commands(subscribe, CHANNELS_PER_COMMAND):
            await pubsub.subscribe(*channels)
        metrics.PRESENCE_CHANNELS.set(len(self._channels.sent) - len(self._typing_channels))

    async def _read(self, pubsub: PubSub) -> None:
        while True:
            message = await pubsub.get_message(timeout=HEARTBEAT_SECONDS)
            if message is None:
                continue
            kind = message["type"]
            if kind == "message":
                self._received(message["channel"], message["data"])
            elif kind == "subscribe":
                self._ended(self._channels.confirmed(message["channel"].decode()))

    def _ended(self, waits: list[object]) -> None:
        for wait in waits:
            if isinstance(wait, _TypingHeld):
                log.info("event=typing_listening partitions=%s",
                         ",".join(map(str, sorted(self.hubs.by_partition))))
                self.subscribed_once.set()
            elif isinstance(wait, asyncio.Future) and not wait.done():
                wait.set_result(None)

    def _received(self, channel: bytes, data: bytes) -> None:
        words = data.decode().split()
        if channel.startswith(_PRESENCE_PREFIX_BYTES):
            frame = presence_frame(words)
            if frame is None:
                return
            for conn in self.watchers.of(words[1]):
                conn.signal(frame)
            metrics.SIGNALS.labels("presence", "received").inc()
            return
        if len(words) != 4:
            return
        origin, sender, to, state = words
        partition = int(channel.rsplit(b":", 1)[1])
        daemon, _, sink = origin.rpartition("/")
        skip = int(sink) if daemon == self.id and sink.isdigit() else None
        frame = orjson.dumps({"type": "typing", "from": sender, "to": to, "state": state, "ttl": self._ttl})
        hub = self.hubs.by_partition.get(partition)
        if hub is None:
            return
        partition_of = self.maps.current.partition_of
        sent = 0
        if partition_of(to) == partition:
            sent += hub.signal(to, frame)
        if partition_of(sender) == partition and sender != to:
            sent += hub.signal(sender, frame, skip)
        metrics.SIGNALS.labels("typing", "received").inc()
        metrics.SIGNAL_FRAMES.inc(sent)

    async def _publish(self) -> None:
        queue = self._typing
        while True:
            await self._typing_ready.wait()
            self._typing_ready.clear()
            while queue:
                batch = [queue.popleft() for _ in range(min(len(queue), CHANGES_BATCH))]
                try:
                    async with self.store.client.pipeline(transaction=False) as pipe:
                        for channels, payload in batch:
                            for channel in channels:
                                pipe.publish(channel, payload)
                        await pipe.execute()
                    metrics.SIGNALS.labels("typing", "published").inc(len(batch))
                except REDIS_ERRORS as exc:
                    self._away(exc)
                    metrics.SIGNALS.labels("typing", "dropped").inc(len(batch))

    async def _flush(self) -> None:
        """Announcements and withdrawals, in the order they happened, a batch per round trip. After
        Redis was away, what it holds for this daemon is made what the tracker holds instead."""
        queue = self._changes
        while True:
            await self._changes_ready.wait()
            self._changes_ready.clear()
            try:
                if self._resync:
                    queue.clear()  # the resync puts every user right
                    await self._reconcile()
                    self._resync = False
                while queue:
                    batch = [queue.popleft() for _ in range(min(len(queue), CHANGES_BATCH))]
                    self._went_offline(batch, await self.store.apply(self.id, batch))
                self._back()
            except REDIS_ERRORS as exc:
                self._away(exc)

    async def _reconcile(self) -> None:
        held = self.tracker.held()
        listed = await self.store.users_of(self.id)
        now = self._wall_ms()
        changes: list[tuple[str, int | None]] = [(u, None) for u in held]  # idempotent: SADD
        changes += [(u, now) for u in listed - held]
        for start in range(0, len(changes), CHANGES_BATCH):
            batch = changes[start:start + CHANGES_BATCH]
            self._went_offline(batch, await self.store.apply(self.id, batch))
        log.info("event=presence_resync daemon=%s users=%d withdrawn=%d", self.id, len(held), len(listed - held))

    def _went_offline(self, batch: list[tuple[str, int | None]], results: list[int]) -> None:
        for (user, last_seen), changed in zip(batch, results, strict=True):
            if last_seen is not None and changed:
                self._seen[user] = max(self._seen.get(user, 0), last_seen)

    async def _tick(self) -> None:
        next_beat = next_store = 0.0
        while True:
            now = self._clock()
            if self.presence:
                for user, last_seen in self.tracker.due(now):
                    self._change(user, last_seen)
            if now >= next_beat:
                next_beat = now + HEARTBEAT_SECONDS
                await self._beat()
            if now >= next_store and self._seen:
                next_store = now + STORE_SECONDS
                await self._store_seen()
            await self._sleep(TICK_SECONDS)

    async def _beat(self) -> None:
        try:
            had, _now = await self.store.heartbeat(self.id)
            if not self.presence:
                self._back()
                return
            if not await self.store.hidden_loaded():
                await self._load_hidden()
            if not had:
                self._resync = True  # Redis lost this daemon (restarted, or swept it after a long pause)
            if self._resync:
                self._changes_ready.set()
            for _ in range(SWEEPS_PER_TICK):
                swept = await self.store.sweep(round(self.settings.signals.presence_daemon_timeout_seconds * 1000))
                if swept is None:
                    break
                dead, last_seen, gone = swept
                for user in gone:
                    self._seen[user] = max(self._seen.get(user, 0), last_seen)
                if gone:
                    log.info("event=presence_swept daemon=%s offline=%d", dead, len(gone))
            if not self._resync:
                self._back()
        except REDIS_ERRORS as exc:
            self._away(exc)

    async def _mysql(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(connection, *args)`` in one transaction, on this shell's own thread."""
        engine = self._engine
        assert engine is not None

        def run() -> T:
            with engine.begin() as conn:
                return fn(conn, *args)

        return await self._threads.run(run)

    async def _load_hidden(self) -> None:
        if self._engine is None:
            await self.store.load_hidden([])
            return
        try:
            users = await self._mysql(presence_sql.hidden_users)
        except SQLAlchemyError:
            log.warning("event=hidden_users_unread action=retry")  # nothing is published until they are loaded
            return
        await self.store.load_hidden(users)

    async def _store_seen(self) -> None:
        seen, self._seen = self._seen, {}
        if self._engine is None:
            return
        try:
            await self._mysql(presence_sql.store_last_seen, seen)
        except SQLAlchemyError:
            log.warning("event=last_seen_unstored users=%d action=retry", len(seen))
            for user, ms in seen.items():  # kept for the next try: one entry per user, so bounded by them
                self._seen[user] = max(self._seen.get(user, 0), ms)
