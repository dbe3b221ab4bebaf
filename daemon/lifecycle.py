"""One daemon process: its start (the stream, the listening socket), what
runs for its life (heartbeats, the idle sweep) and its shutdown (the drain,
then bounded steps), until SIGTERM. ``python -m daemon`` runs ``run``.

Each WebSocket is pinged every ``CHAT_PING_INTERVAL_SECONDS``, aborted when
its pong is ``CHAT_PING_TIMEOUT_SECONDS`` late, and closed with 4001 once
its token expires. On SIGTERM, every WebSocket is closed with 1012 and
waiting polls are answered at once. A new slot map does not stop the daemon:
only the clients of users whose slot moved are closed, once what was
committed before the move has reached them, and a partition it is to serve
too gets streams built and run here (``daemon.handover``). Only a map it
cannot follow so stops it, as SIGTERM does, with status 0: supervisord starts
it again on the new map.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Awaitable, Callable

from chat.errors import CloseCode
from chat.metrics_port import serve_metrics
from chat.partitions import SlotMap
from chat.serve import LISTEN_BACKLOG, reuseport_socket
from chat.settings import Settings
from chat.signal_store import SignalStore, connect
from chat.stopping import bounded, exit_by, stop_on_signals
from daemon import handover, metrics, partition_streams
from daemon.acceptor import Acceptor, connection_ceiling
from daemon.connection import Connection
from chat.partitions import LiveMap
from daemon.routes import Router
from daemon.server import Daemon
from daemon.signals import Signals
from db import mongo
from db.conversation_state import UnreadTotals
from db.sql import make_engine
from oplog.events import OplogSource
from writer.client import RemoteWriter

log = logging.getLogger("chat.daemon")

# After the drain, each step of the shutdown gets this long, and the whole of it
# SHUTDOWN_GRACE_SECONDS, whatever the stores do: well inside supervisord's 20 s.
SHUTDOWN_STEP_SECONDS = 1.0
SHUTDOWN_GRACE_SECONDS = 3.0
# Heartbeats visit the WebSockets this many at a time, then let the loop run.
# One pass over 10,000 of them (about 500 pings a second at a 20 s interval)
# held the loop for 18-26 ms of CPU each second (measured, instrumented, in the
# replay benchmark), and every message that arrived meanwhile waited for it;
# slices of 256 hold it for 2-6 ms.
HEARTBEAT_SLICE = 256


async def heartbeats(daemon: Daemon, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """Each tick, visits the WebSockets whose heartbeat is due (``daemon.due``,
    ``Connection.next_due``) and schedules each again at its next due time.
    An idle socket is visited about once per ping interval, not every tick:
    visiting every one every tick cost about 1 us per socket per second.
    ``clock`` and ``sleep`` are the time it reads and the wait between ticks
    (a monotonic clock, and ``asyncio.sleep``): the tests pass a fake pair."""
    sockets, wheel = daemon.sockets, daemon.due
    while True:
        await sleep(daemon.heartbeat_tick)
        close_idle_http(daemon, clock())
        due = wheel.pop_due(clock())
        for start in range(0, len(due), HEARTBEAT_SLICE):
            if start:
                await asyncio.sleep(0)  # deliveries go first: a yield to the loop, not a wait for time
            now = clock()
            for conn in due[start:start + HEARTBEAT_SLICE]:
                if conn in sockets:  # else closed since it was scheduled: dropped
                    conn.heartbeat(now)
                    if conn in sockets:  # not closed by it (4001)
                        wheel.schedule(conn, conn.next_due())


def idle_too_long(idle_since: float | None, now: float, limit: float) -> bool:
    """Whether an HTTP connection idle since ``idle_since`` (None: it has a request in hand) is past ``limit``."""
    return idle_since is not None and now - idle_since > limit


def close_idle_http(daemon: Daemon, now: float) -> None:
    """Closes HTTP connections that have had no request in hand for
    ``http_idle_seconds``: an idle keep-alive, or a request head that
    trickles in (slowloris) or never comes. Each holds a file descriptor."""
    limit, http_conns = daemon.settings.daemon.http_idle_seconds, daemon.state.http_conns
    for conn in [c for c in http_conns if idle_too_long(c.idle_since(), now, limit)]:
        metrics.CLOSES.labels("http_idle").inc()
        http_conns.discard(conn)
        conn.close_idle(abort_unread=True)  # a client that has not read its last answer for this long: owed nothing


async def drain(daemon: Daemon) -> None:
    """SIGTERM: refuse new clients, answer waiting polls now, close every
    WebSocket with 1012 so that clients reconnect elsewhere, and give
    them ``drain_seconds`` to go."""
    state = daemon.state
    state.draining = True
    for waiter in list(daemon.polls):
        waiter.wake.set()
    for conn in list(daemon.sockets):
        conn.close(CloseCode.RESTART, "daemon restarting: reconnect with since")
    deadline = time.monotonic() + daemon.settings.daemon.drain_seconds
    while daemon.polls and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    # Made connections only: one the acceptor has counted but whose transport
    # is not made yet has nothing to close; a request it sends is answered
    # with `Connection: close` (the state is draining).
    for conn in list(state.http_conns):
        if conn.idle_since() is not None:
            conn.close_idle(abort_unread=False)  # idle keep-alive HTTP
    while state.conns and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # close frames flushing, clients answering


async def run(settings: Settings, tail: OplogSource | None = None) -> None:
    """One daemon process: the stream, the listening socket, until SIGTERM.
    ``tail`` replaces the oplog tail (the replay benchmark feeds recorded entries)."""
    loop = asyncio.get_running_loop()
    client = mongo.make_client(settings.stores.mongo_url.get_secret_value(), settings.stores.db_timeout_seconds)
    stop = stop_on_signals()
    # The slot map first (from MySQL, waited for): which streams to run, and whom to serve.
    # A race, not a TaskGroup: the first of the two to end decides, where a group would wait for both.
    building = loop.create_task(partition_streams.build(settings, client, tail))
    stopping = loop.create_task(stop.wait())
    await asyncio.wait([building, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not building.done():  # SIGTERM before the map could be read: nothing was served
        building.cancel()
        await asyncio.gather(building, return_exceptions=True)
        await bounded("mongo_close", client.close(), SHUTDOWN_STEP_SECONDS, log)
        log.info("event=daemon_stopped before=slot_map")
        return
    parts = building.result()
    writer = None
    if settings.writer.socket:  # clients' acks and read markers go through the host's writer, as POSTs do
        writer = RemoteWriter(settings.writer.socket, wait_seconds=settings.writer.wait_seconds,
                              reply_seconds=3 * settings.stores.db_timeout_seconds + settings.writer.wait_seconds)
    unread = None
    if settings.daemon.fill_holes_from_mysql:
        unread = UnreadTotals(make_engine(settings.stores.mysql_url.get_secret_value(),
                                          settings.stores.db_timeout_seconds,
                                          pool_size=2, reads_only=True))
    maps = LiveMap(parts.slot_map)  # the one map every decision reads, replaced by a move (daemon.handover)
    signals = None
    presence_engine = None
    if settings.stores.redis_url.get_secret_value():  # typing and presence (docs/presence.md)
        if settings.daemon.fill_holes_from_mysql:  # last_seen and the hidden users: one connection is plenty
            presence_engine = make_engine(settings.stores.mysql_url.get_secret_value(),
                                          settings.stores.db_timeout_seconds,
                                          pool_size=1)
        url = settings.stores.redis_url.get_secret_value()
        timeout = settings.stores.db_timeout_seconds
        signals = Signals(settings, SignalStore(connect(url, timeout)), connect(url, timeout, retries=0),
                          parts.hubs, maps, presence_engine)
    daemon = Daemon(settings, parts.hubs, parts.first, streams=parts.streams, maps=maps,
                    writer=writer, unread=unread, signals=signals)
    failed: list[BaseException] = []

    def must_not_end(task: asyncio.Task) -> None:
        # The streams and the heartbeats run for the life of the process. One
        # that ends has failed, and a daemon without its stream would accept
        # clients and deliver nothing: drain and exit non-zero, so that
        # supervisord starts a fresh one.
        if not task.cancelled() and not stop.is_set():
            failed.append(task.exception() or RuntimeError(f"{task.get_name()} ended"))
            log.error("event=task_failed task=%s action=exit", task.get_name(), exc_info=failed[-1])
            stop.set()

    def outgrown(task: asyncio.Task) -> None:
        # A map the daemon cannot follow in place (daemon.handover) ends it as SIGTERM does, with
        # status 0: it is to run again on the new map.
        if not task.cancelled() and not stop.is_set():
            if task.exception() is not None:
                must_not_end(task)
            stop.set()

    added: list[partition_streams.Partitions] = []  # partitions a grown map gave it (daemon.handover)

    async def lifelong() -> None:
        # One TaskGroup holds what runs for the life of the process, and the
        # shutdown cancels it as one (bounded: below). A task that ends does not
        # end the daemon here but through ``stop`` (its callback): the drain
        # comes first, with the rest still running, as on SIGTERM. One that
        # fails makes the group cancel the rest at once; the drain still runs.
        async with asyncio.TaskGroup() as group:
            async def grow(partitions: frozenset[int], slot_map: SlotMap) -> partition_streams.Partitions:
                more = partition_streams.extend(settings, client, partitions, slot_map)
                added.append(more)  # closed with the rest, ready or not
                for run_stream in more.loops:
                    group.create_task(run_stream, name="stream").add_done_callback(must_not_end)
                await asyncio.gather(*(stream.ready.wait() for stream in more.streams.values()))
                return more

            for run_stream in parts.loops:
                group.create_task(run_stream, name="stream").add_done_callback(must_not_end)
            group.create_task(heartbeats(daemon), name="heartbeats").add_done_callback(must_not_end)
            if signals is not None:
                group.create_task(signals.run(), name="signals").add_done_callback(must_not_end)
            if parts.engine is not None:
                # A recorded oplog (``tail``) feeds one partition: a grown map restarts such a daemon.
                group.create_task(handover.follow(daemon, parts.engine, settings, grow if tail is None else None),
                                  name="slot-map").add_done_callback(outgrown)

    running = loop.create_task(lifelong(), name="daemon")
    # Past the cap, a connection is refused once it sends a request (503, as
    # it should be told); past the ceiling above it, at once, so that silent
    # sockets stop short of the open-files limit.
    ceiling = connection_ceiling(settings.daemon.max_connections)
    listener = reuseport_socket(settings.daemon.host, settings.daemon.port, listen=False)
    state, router = daemon.state, Router(daemon)
    acceptor = Acceptor(loop, listener, lambda: Connection(state, router),
                        room=lambda accepting: len(state.conns) + accepting < ceiling)
    # What exists now (modules, classes, settings: some 60,000 objects) lives
    # as long as the process: out of the cyclic GC's sight, so that its full
    # passes walk only what the connections and messages create since.
    gc.freeze()
    metrics.watch_gc()
    serve_metrics(settings.daemon.metrics_host, settings.daemon.metrics_port)
    listener.listen(LISTEN_BACKLOG)  # only now: the kernel queues connections for this process from here on
    acceptor.start()
    log.info("event=daemon_started port=%d pid=%d", settings.daemon.port, os.getpid())
    try:
        await stop.wait()
        log.info("event=daemon_draining connections=%d", daemon.hub.count)
        exit_by(settings.daemon.drain_seconds + SHUTDOWN_GRACE_SECONDS, lambda: 1 if failed else 0, log)
        acceptor.close()
        await drain(daemon)
    finally:
        # Each step bounded: with a store that hangs, the stream's reads clean
        # up by talking to it, and the Mongo client's close asks it to end its
        # sessions, each up to a socket timeout (10 s).
        running.cancel()
        await bounded("tasks", asyncio.gather(running, return_exceptions=True), SHUTDOWN_STEP_SECONDS, log)
        await bounded("mongo_close", client.close(), SHUTDOWN_STEP_SECONDS, log)
        if writer is not None:
            await bounded("writer_close", writer.close(), SHUTDOWN_STEP_SECONDS, log)
        if unread is not None:
            unread.close()
        if signals is not None:
            await bounded("signals_close", signals.close(), SHUTDOWN_STEP_SECONDS, log)
        if presence_engine is not None:
            presence_engine.dispose()
        parts.close()
        for more in added:
            more.close()
        log.info("event=daemon_stopped")
    if failed:
        raise SystemExit(1)
