"""The wake of a leading writer's echo watch, through Redis (``writer.echo_watch``).

With writes led per partition, a commit whose originals owe copies to a
partition led by another host leaves echo rows for that host's watch, which
reads them every ``CHAT_WRITER_ECHO_WATCH_MS``. Without a wake each copy between
hosts waits half that period on average, and every led partition's watch reads
MySQL that often whether anything is owed or not. So once the commit is
done, its writer publishes the partitions it left echoes for on
``ECHO_CHANNEL``; every writer that leads one of them reads its echoes at
once. The period is then only what a lost wake waits: best-effort, as the
tails' wake (``oplog.wake``), and nothing is lost without it, since the echo
rows are the debt and the watch (or any turn's drain) pays it.

The message is the partitions' numbers in ASCII, comma-separated (``b"0,3"``):
a listener ignores what it cannot read, and numbers it does not lead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from chat.signal_store import REDIS_ERRORS
from oplog.wake import listen

log = logging.getLogger("chat.writer")

ECHO_CHANNEL = "chat:echoes"
MOST_PARTITIONS_IN_A_WAKE = 64  # a longer message is not a writer's: ignored


def encode(partitions: set[int]) -> bytes:
    return ",".join(str(k) for k in sorted(partitions)).encode()


def decode(data: bytes) -> list[int]:
    """The partitions a wake names; [] for anything else (nothing wakes, the watch's period still holds)."""
    parts = data.split(b",")
    if len(parts) > MOST_PARTITIONS_IN_A_WAKE or not all(p.isdigit() and len(p) <= 3 for p in parts):
        return []
    return [int(p) for p in parts]


class EchoWakes:
    """The committing side: ``owed(partition)`` after a commit left echoes for it.
    Never waits and never raises. One publish at a time: the partitions owed
    while one is in flight go in the next, so a busy writer publishes once per
    round trip to Redis, not once per commit, and no wake is dropped."""

    def __init__(self, publish: Callable[[bytes], Awaitable[object]]):
        self._publish = publish
        self._due: set[int] = set()
        self._task: asyncio.Task | None = None
        self._away = False
        self.published = self.failed = 0

    @classmethod
    def on_redis(cls, client: aioredis.Redis) -> EchoWakes:
        return cls(lambda data: client.publish(ECHO_CHANNEL, data))

    def owed(self, partition: int) -> None:
        self._due.add(partition)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send(), name="echo-wake-publish")

    async def settled(self) -> None:
        """Until the publishes under way have ended (a stopping writer closes its client after them)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _send(self) -> None:
        while self._due:
            due, self._due = self._due, set()
            try:
                await self._publish(encode(due))
                self.published += 1
                if self._away:
                    self._away = False
                    log.info("event=echo_wake_back")
            except REDIS_ERRORS as exc:
                self.failed += 1
                if not self._away:  # once per outage: the watches read at their period meanwhile
                    self._away = True
                    log.warning("event=echo_wake_failed error=%s action=watches_read_at_their_period",
                                exc.__class__.__name__)


async def listen_for_echo_wakes(url: str, woken: Callable[[list[int]], None], *, connect_seconds: float) -> None:
    """For the life of the process: ``woken(partitions)`` for each wake on ``ECHO_CHANNEL``
    (``PartitionedWriter.echoes_woken``, which wakes the watches of those it leads)."""
    await listen(url, ECHO_CHANNEL, lambda data: woken(decode(data)), connect_seconds=connect_seconds,
                 what="echo_watches_read_at_their_period")
