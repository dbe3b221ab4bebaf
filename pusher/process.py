"""The pusher process (``python -m pusher``): offline push for what no device
received (docs/push.md).

For each partition it holds a lease, the MySQL named lock
``chat.writer.p{k}.pusher`` (one pusher per partition at a time, across
hosts: the others wait for it). Holding it, it turns one step at a time:

1. **Decide.** The partition's rows past ``push_state.upto`` whose
   ``CHAT_PUSH_DELAY_SECONDS`` is over, in id order: the messages whose
   recipient no device acknowledged and who did not read them get one
   notification per registered device of the recipient (coalesced: one per
   device per step), written to ``push_outbox`` in the transaction that moves
   ``push_state.upto`` past them.
2. **Send.** The outbox rows that are due go to the gateway; each accepted one
   is deleted, a rejected pushkey's registration removed, a failure retried
   with exponential backoff and jitter, for ``CHAT_PUSH_GIVE_UP_SECONDS``.

So a pusher killed at any point loses nothing (the outbox and the position are
in MySQL) and resends at most what the gateway took but whose answer it had
not recorded, under the same idempotency key. The gateway's speed never
touches delivery: this is its own process, its queue is the outbox in MySQL,
and it decides no further while the outbox holds ``CHAT_PUSH_OUTBOX_MAX`` notifications.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import orjson
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import SQLAlchemyError

from chat.metrics_port import serve_metrics
from chat.partitions import LiveMap, SlotMap
from chat.settings import Settings
from chat.stopping import stop_on_signals
from db.partition_map import load_slot_map, watch_slot_map
from db.sql import make_engine
from db.threads import Threads
from pusher import core, metrics, store
from pusher.gateway import GatewayAnswer, Gateway

log = logging.getLogger("chat.pusher")
T = TypeVar("T")

TICK_SECONDS = 0.1  # a step's pause when there was nothing to do
LEASE_RETRY_SECONDS = 1.0  # how often a pusher without the lease asks for it again
SEND_BATCH = 128  # outbox rows taken per step, and settled together
# Requests to the gateway at once. A gateway's answer takes what its own call to APNs or
# FCM takes (tens of ms; 44 ms from the benchmark's gateway on this loaded box): at 8 at
# once the pusher sent 180 notifications/s and fell behind 250/s.
SEND_CONCURRENCY = 64


class PartitionPusher:
    """The pusher of one partition: its lease, its steps."""

    def __init__(self, partition: int, engine: Engine, gateway: Gateway, settings: Settings, slot_map: LiveMap,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC), rng: random.Random | None = None):
        self.partition = partition
        self._engine = engine
        self._gateway = gateway
        self._settings = settings
        self._lives_here = lambda user: slot_map.current.partition_of(user) == partition
        self._clock = clock
        self._rng = rng or random.Random()
        self._threads = Threads(1, f"pusher_p{partition}")
        self._position = 0
        self._label = str(partition)
        self._held = False  # the last step decided nothing, the outbox full: logged once, as it starts

    async def run(self, stop: asyncio.Event) -> None:
        """Takes the lease when it is free, pushes while it holds it, until ``stop``."""
        while not stop.is_set():
            conn = None
            try:
                conn = await self._sql(self._engine.connect)
                if await self._sql(store.take_lease, conn, self.partition):
                    metrics.LEASES.inc()
                    log.info("event=lease_taken partition=%d", self.partition)
                    try:
                        await self._hold(conn, stop)
                    finally:
                        metrics.LEASES.dec()
            except SQLAlchemyError as exc:
                log.warning("event=pusher_mysql_failed partition=%d error=%s", self.partition,
                            exc.__class__.__name__)
            finally:
                if conn is not None:
                    await self._sql(_close, conn)  # the lease, if held, dies with the session
            await _wait(stop, LEASE_RETRY_SECONDS)

    async def _hold(self, conn: Connection, stop: asyncio.Event) -> None:
        self._position = await self._sql(store.start_position, conn, self.partition)
        checked = time.monotonic()
        while not stop.is_set():
            more_due, next_due = await self._decide(conn)
            more_sends = await self._send(conn)
            if time.monotonic() - checked > LEASE_RETRY_SECONDS:
                checked = time.monotonic()
                if not await self._sql(store.still_held, conn, self.partition):
                    log.warning("event=lease_lost partition=%d", self.partition)
                    return
            if not (more_due or more_sends):
                await _wait(stop, core.pause(next_due, self._clock(), TICK_SECONDS, LEASE_RETRY_SECONDS))

    async def _decide(self, conn: Connection) -> tuple[bool, datetime | None]:
        """Decides the rows that are due; returns (more may be due at once: a full page
        was read, when the next row not yet due will be)."""
        size = await self._sql(store.outbox_size, conn, self.partition)
        metrics.OUTBOX.labels(self._label).set(size)
        bound = self._settings.push.outbox_max
        if size >= bound:  # deciding waits: the queue is bounded while the gateway is down
            metrics.HELD.labels(self._label).inc()
            if not self._held:
                log.warning("event=push_outbox_full partition=%d outbox=%d max=%d action=deciding_waits",
                            self.partition, size, bound)
            self._held = True
            return False, None
        self._held = False
        now = self._clock()
        rows = await self._sql(store.rows_after, conn, self.partition, self._position,
                               self._settings.push.content == "full")
        taken, upto, next_due = core.due(rows, now, self._settings.push.delay_seconds)
        if upto is None:
            return False, next_due
        notes: list[core.Notification] = []
        candidates = {r.recipient for r in taken if self._lives_here(r.recipient) and r.recipient != r.sender}
        if candidates:
            pairs = {(r.recipient, r.sender) for r in taken}
            acked, read, registered = await self._sql(store.what_they_have, conn, candidates, pairs)
            missed = core.missed(taken, self._lives_here, acked, read,
                                 now - timedelta(seconds=self._settings.push.give_up_seconds))
            missed = {user: rows for user, rows in missed.items() if registered.get(user)}
            if missed:
                unread = await self._sql(store.unread_totals, conn, self.partition, set(missed))
                for user, rows in missed.items():
                    notes += core.notifications(self.partition, user, rows, registered[user], unread[user],
                                                self._settings.push.content)
        await self._sql(store.decided, conn, self.partition, upto, notes, now)
        self._position = upto
        metrics.DECIDED.labels(self._label).set(upto)
        if notes:
            log.info("event=push_decided partition=%d upto=%d notifications=%d", self.partition, upto, len(notes))
        return len(rows) == store.PAGE and next_due is None, next_due

    async def _send(self, conn: Connection) -> bool:
        """Sends the outbox rows that are due; True if a full batch went (more may be due)."""
        now = self._clock()
        due = await self._sql(store.outbox_due, conn, self.partition, now, SEND_BATCH)
        if not due:
            return False
        limit = asyncio.Semaphore(SEND_CONCURRENCY)

        async def one(row: Row) -> tuple[Row, GatewayAnswer]:
            async with limit:
                return row, await self._gateway.notify(orjson.loads(row.notification), row.key)

        answers = await asyncio.gather(*(one(row) for row in due))
        # The batch is settled in one statement once all its answers are in: a pusher
        # killed before that sends its accepted ones again (SEND_BATCH at most), under
        # the same keys.
        done = [row.key for row, answer in answers if answer.accepted or self._gives_up(row, answer)]
        await self._sql(store.sent, conn, done)
        for row, answer in answers:
            await self._settle(conn, row, answer)
        return len(due) == SEND_BATCH

    def _gives_up(self, row: Row, answer: GatewayAnswer) -> bool:
        return not answer.accepted and core.gives_up(row.created_at.replace(tzinfo=UTC), self._clock(),
                                                     self._settings.push.give_up_seconds)

    async def _settle(self, conn: Connection, row: Row, answer: GatewayAnswer) -> None:
        """What a row's answer leaves to do once the batch's taken rows are deleted."""
        now = self._clock()
        if answer.accepted:
            metrics.NOTIFICATIONS.labels("sent").inc()
            metrics.OUTBOX_WAIT.observe(max(0.0, (now - row.created_at.replace(tzinfo=UTC)).total_seconds()))
            if answer.rejected:
                removed = await self._sql(store.forget_pushkeys, conn, [(row.user, key) for key in answer.rejected])
                metrics.NOTIFICATIONS.labels("rejected").inc(len(answer.rejected))
                log.warning("event=pushkey_rejected partition=%d user=%s pushkeys=%d registrations_removed=%d",
                            self.partition, row.user, len(answer.rejected), removed)
        elif self._gives_up(row, answer):
            metrics.NOTIFICATIONS.labels("given_up").inc()
            log.error("event=push_given_up partition=%d key=%s attempts=%d last=%s", self.partition, row.key,
                      row.attempts + 1, answer.detail)
        else:
            attempts = row.attempts + 1
            wait = core.retry_in(attempts, self._rng)
            metrics.NOTIFICATIONS.labels("failed").inc()
            log.warning("event=push_failed partition=%d key=%s attempt=%d error=%s retry_in_s=%.1f",
                        self.partition, row.key, attempts, answer.detail, wait)
            await self._sql(store.retry_later, conn, row.key, attempts, now + timedelta(seconds=wait))

    async def _sql(self, fn: Callable[..., T], *args: object) -> T:
        return await self._threads.run(fn, *args)

    def close(self) -> None:
        self._threads.close()


def _close(conn: Connection) -> None:
    try:
        conn.close()
    except SQLAlchemyError:
        conn.invalidate()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


async def run(settings: Settings) -> None:
    """Every partition's pusher, until SIGTERM."""
    stop = stop_on_signals()
    serve_metrics(settings.push.metrics_host, settings.push.metrics_port)
    if not settings.push.gateway_url:
        log.warning("event=pusher_idle reason=no_CHAT_PUSH_GATEWAY_URL")
        await stop.wait()
        return
    engine = make_engine(settings.stores.mysql_url.get_secret_value(), settings.stores.db_timeout_seconds)
    live = LiveMap(load_slot_map(engine))
    gateway = Gateway(settings.push.gateway_url)
    pushers: list[PartitionPusher] = []
    log.info("event=pusher_started partitions=%d gateway=%s delay_s=%g content=%s", live.current.partitions,
             settings.push.gateway_url, settings.push.delay_seconds, settings.push.content)
    try:
        async with asyncio.TaskGroup() as group:
            def adopt(found: SlotMap) -> None:
                # a move's cutover: the new map's partitions get their pushers (the task below ends with ``stop``)
                live.adopt(found)
                for k in range(len(pushers), live.current.partitions):
                    pushers.append(PartitionPusher(k, engine, gateway, settings, live))
                    group.create_task(pushers[-1].run(stop), name=f"pusher_p{k}")

            adopt(live.current)
            watching = group.create_task(watch_slot_map(engine, lambda: live.current, adopt,
                                                        settings.daemon.gap_check_seconds), name="slot_map")
            group.create_task(_cancel_on(stop, watching), name="stop_watch")
    finally:
        await gateway.close()
        for p in pushers:
            p.close()
        engine.dispose()
        log.info("event=pusher_stopped")


async def _cancel_on(stop: asyncio.Event, task: asyncio.Task) -> None:
    await stop.wait()
    task.cancel()
