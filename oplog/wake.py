"""The writer's wake for the FerretDB tails, through Redis (``oplog.pace``).

A polled tail backs off while idle; the writer publishes a tiny message on
``WAKE_CHANNEL`` after each batch it inserts into the fast store, and each
tail (the relay's, or a daemon's that tails by itself) cuts its backoff short
and polls at once. Best-effort on both sides: a failed publish is passed
over, a listener whose Redis is away retries quietly, and meanwhile the
backoff's cap bounds the delay of a first message after a quiet spell. On
MongoDB the tail waits on the server (awaitData) and a wake changes nothing.

The writer publishes at most once per ``WAKE_EVERY`` seconds (the first write
after a quiet spell at once): a tail woken within that time polls at the base
pace still (it backs off after ``oplog.pace.IDLE_AFTER_SECONDS`` of quiet,
longer than ``WAKE_EVERY``), so the wakes skipped are ones no tail needs, and
a busy writer spends a publish per ``WAKE_EVERY``, not per batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from chat.signal_store import REDIS_ERRORS, subscribe_forever

log = logging.getLogger("chat.oplog")

WAKE_CHANNEL = "chat:wake"
WAKE_EVERY = 0.2  # seconds between two publishes, at most one each; below oplog.pace.IDLE_AFTER_SECONDS
LISTEN_SECONDS = 30.0  # an idle listener's read returns this often (and Redis's health is checked)
RETRY_SECONDS = 1.0  # a listener whose Redis is away subscribes again after this


class WakeThrottle:
    """Whether a write's wake is published: the first at once, then at most one per ``every`` seconds."""

    def __init__(self, every: float = WAKE_EVERY):
        self.every = every
        self._last: float | None = None

    def due(self, now: float) -> bool:
        if self._last is not None and now - self._last < self.every:
            return False
        self._last = now
        return True


class WakePublisher:
    """The writer's side: ``wake()`` after each batch stored in the fast store. Never
    waits and never raises: the publish runs in the background, one at a time."""

    def __init__(self, publish: Callable[[], Awaitable[object]], *, clock: Callable[[], float] = time.monotonic,
                 every: float = WAKE_EVERY):
        self._publish = publish
        self._clock = clock
        self._throttle = WakeThrottle(every)
        self._task: asyncio.Task | None = None
        self._away = False
        self.published = self.failed = 0

    @classmethod
    def on_redis(cls, client: aioredis.Redis) -> WakePublisher:
        return cls(lambda: client.publish(WAKE_CHANNEL, b"1"))

    def wake(self) -> None:
        if (self._task is not None and not self._task.done()) or not self._throttle.due(self._clock()):
            return
        self._task = asyncio.get_running_loop().create_task(self._send(), name="wake-publish")

    async def settled(self) -> None:
        """Until the publish in flight, if any, has ended (a stopping writer closes its client after it)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _send(self) -> None:
        try:
            await self._publish()
            self.published += 1
            if self._away:
                self._away = False
                log.info("event=wake_publish_back")
        except REDIS_ERRORS as exc:
            self.failed += 1
            if not self._away:  # once per outage: the backoff's cap bounds the delay meanwhile
                self._away = True
                log.warning("event=wake_publish_failed error=%s action=tails_back_off_alone", exc.__class__.__name__)


async def listen_for_wakes(url: str, wake: Callable[[], None], *, connect_seconds: float,
                           sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """For the life of the process: ``wake()`` on each message on ``WAKE_CHANNEL``."""
    await listen(url, WAKE_CHANNEL, lambda _data: wake(), connect_seconds=connect_seconds, what="tail_backs_off_alone",
                 sleep=sleep)


async def listen(url: str, channel: str, on_data: Callable[[bytes], None], *, connect_seconds: float, what: str,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """For the life of the process: ``on_data(data)`` for each message on ``channel``.
    Its own client (a subscribed connection does nothing else), whose reads have
    no time-out of their own: an idle one waits ``LISTEN_SECONDS`` per read.
    ``what``: what goes on while Redis is away, for the log."""
    client = aioredis.from_url(url, socket_connect_timeout=connect_seconds, health_check_interval=LISTEN_SECONDS)
    away = False

    def subscribed() -> None:
        nonlocal away
        away = False
        log.info("event=wake_listening channel=%s", channel)

    def lost(exc: BaseException) -> None:
        nonlocal away
        if not away:
            away = True
            log.warning("event=wake_unreachable channel=%s error=%s action=%s retry_in_s=%g", channel,
                        exc.__class__.__name__, what, RETRY_SECONDS)

    try:
        await subscribe_forever(client, [channel], lambda _channel, data: on_data(data), on_subscribed=subscribed,
                                on_away=lost, read_seconds=LISTEN_SECONDS, retry_seconds=RETRY_SECONDS, sleep=sleep)
    finally:
        await client.aclose()
