"""The daemon's routes and lifecycle: /v1/ws, /v1/poll, /healthz, /metrics.

It moves data between sockets (``daemon.connection``) and the core
(``daemon.hub``, ``daemon.stream``) and holds no delivery rules of its own.
Refused handshakes: 401 bad token, 403 origin not allowed, 426 not a
WebSocket handshake, 503 at capacity or restarting. A daemon that has not
reached the client's ``since`` within 2 s closes with 1013 (poll: 503). A
WebSocket whose token expires is closed with 4001 (the heartbeat sees it).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
import urllib.parse
from collections.abc import AsyncIterator

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chat import auth
from chat.metrics_port import serve_metrics
from chat.parsing import is_decimal
from chat.serve import LISTEN_BACKLOG, reuseport_socket
from chat.settings import Settings
from chat.stopping import bounded, exit_by, stop_on_signals
from daemon import handshake, metrics
from daemon.acceptor import Acceptor, connection_ceiling
from daemon.connection import CLOSE_ERROR, CLOSE_RESTART, CLOSE_TRY_AGAIN, Connection, Request
from daemon.handshake import error_body as _error_body
from daemon.hub import Hub, Subscriber
from daemon.oplog import OplogTail
from daemon.catchup import CatchUp, first_page
from daemon.stream import Stream
from daemon.wire import text_frame
from db import mongo
from db.sql import make_engine
from db.stream_ranges import StreamRanges
from relay.client import RelayTail

log = logging.getLogger("chat.daemon")

POLL_DEFAULT_TIMEOUT = 25.0  # seconds, when a poll names none (and the cap allows it)
FUTURE_SINCE_WAIT = 2.0  # a `since` from a daemon that is ahead of this one
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
# A WebSocket catch-up goes out in pages of at most this many messages (and a
# quarter of the send buffer's bound), each once the socket has sent most of
# the page before: a client resuming from far back costs one page of memory,
# not its whole backlog, and a slow reader is paced instead of cut off (4008).
CATCH_UP_PAGE = 1000


class Refusal(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict | None = None, field: str | None = None):
        super().__init__(message)
        self.status, self.code, self.headers, self.field = status, code, headers or {}, field

    def body(self) -> bytes:
        return _error_body(self.code, str(self), self.field)


class Behind(Exception):
    """This daemon has not yet reached the client's ``since``."""


MAX_ID = 2**63 - 1  # BSON's widest integer: a larger `since` cannot be looked up, so it is unknown


def parse_since(raw: str | None) -> int | None:
    """A resume point: a message id or a hello cursor (both decimal strings)."""
    if raw is None or not is_decimal(raw, 19) or int(raw) > MAX_ID:
        return None
    return int(raw)


class PollWaiter(Subscriber):
    """A long-poll: collects what the hub sends until the answer goes out."""

    __slots__ = ("items", "wake")

    def __init__(self, user: str, since: int):
        super().__init__(user, since)
        self.items: list[tuple[int, bytes]] = []
        self.wake = asyncio.Event()

    def send(self, msg_id: int, payload: bytes, frame: bytes | None) -> None:
        self.items.append((msg_id, payload))
        self.wake.set()

    def overflow(self) -> None:
        self.wake.set()  # answer with the gap-free prefix it holds; the cursor resumes there


class Daemon:
    def __init__(self, settings: Settings, hub: Hub, stream: Stream):
        self.settings = settings
        self.hub = hub
        self.stream = stream
        self.conns: set[Connection] = set()  # every open connection: the cap, the drain
        self.http_conns: set[Connection] = set()  # those not (yet) WebSockets: the idle sweep
        self.sockets: set[Connection] = set()  # the WebSockets among them, for heartbeats
        self.polls: set[PollWaiter] = set()
        self.draining = False

    # --- admission ------------------------------------------------------------
    def admit(self, token: str | None, origin: str | None) -> tuple[str, float]:
        """The user and the token's ``exp`` (Unix time), decided before anything
        is registered; or a Refusal."""
        try:
            user, expires = auth.verify_until(self.settings.jwt_secret.get_secret_value(), token)
        except auth.AuthError as exc:
            metrics.REJECTS.labels("auth").inc()
            raise Refusal(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"}) from None
        if origin is not None and not self.origin_allowed(origin):
            metrics.REJECTS.labels("origin").inc()
            raise Refusal(403, "origin_not_allowed", f"origin {origin!r} is not allowed")
        # Every open socket counts, this one included: handshakes under way and
        # idle keep-alives hold file descriptors as much as WebSockets do.
        if len(self.conns) > self.settings.max_connections or self.draining or not self.stream.ready.is_set():
            # Starting too: a client that waited here would wait out the stream's
            # start-up (seconds on FerretDB), where a retry may reach a ready daemon.
            metrics.REJECTS.labels("capacity").inc()
            raise Refusal(503, "try_again_later", "this daemon is full, starting or restarting; retry",
                          {"Retry-After": "1"})
        return user, expires

    def origin_allowed(self, origin: str) -> bool:
        allowed = self.settings.allowed_origins
        return "*" in allowed or origin in allowed

    async def subscribe(self, sub: Subscriber, since: int | None, most: int | None = None,
                        max_bytes: int | None = None) -> tuple[AsyncIterator[CatchUp], int]:
        """Registers ``sub``; returns its catch-up, in pages of at most ``most``
        messages and ``max_bytes`` of payload, and the cursor.

        The stream position is read and the subscriber registered with no
        await in between: catch-up covers (since, position], live frames the rest.
        """
        position = self.stream.position
        sub.last_id = since if since is not None else position
        self.hub.register(sub)
        if since is None:
            return _one(CatchUp(False, [])), position
        if since > position and not await self.stream.wait_for(since, FUTURE_SINCE_WAIT):
            if await self.stream.is_stored(since):
                # The client saw more than this daemon has (it came from one
                # further along). Not "recovered: false", which would send it to
                # reload history: it retries, here or elsewhere, with this since.
                self.hub.unregister(sub)
                raise Behind()
            sub.last_id = position  # no message has that id: serve from here
            return _one(CatchUp(False, [])), position
        return self.stream.pages(sub.user, since, position, most, max_bytes), max(position, since)

    # --- /v1/ws ---------------------------------------------------------------------
    async def handle_upgrade(self, conn: Connection, request: Request) -> bool:
        """The WebSocket handshake; True once the connection is a WebSocket."""
        path, query = _split(request.target)
        if path != "/v1/ws":
            conn.respond(404, _error_body("not_found", f"no route {path}"), False)
            return False
        response = handshake.accept(conn, path, request)
        if response is None:
            return False
        try:
            token = query.get("token") or auth.bearer(request.headers.get("authorization"))
            user, expires = self.admit(token, request.headers.get("origin"))
        except Refusal as refusal:
            conn.respond(refusal.status, refusal.body(), False, refusal.headers)
            return False
        if conn.closing:
            return True
        conn.upgrade(user, response)
        # One number per socket; the heartbeat closes it with 4001 once it is past.
        conn.expires = time.monotonic() + (expires - time.time())
        self.sockets.add(conn)
        metrics.WS_OPEN.inc()
        try:
            await self.serve_socket(conn, user, parse_since(query.get("since")))
        except Behind:
            metrics.REJECTS.labels("behind").inc()
            conn.close(CLOSE_TRY_AGAIN, "this daemon is behind your since: retry")
        except Exception:
            log.exception("event=ws_error user=%s", user)
            conn.close(CLOSE_ERROR, "server error")
        return True

    async def serve_socket(self, conn: Connection, user: str, since: int | None) -> None:
        """The hello, the catch-up a page at a time, then live frames.

        Each page goes out once the socket has sent most of the one before
        (``drained``), so the daemon holds one page of a long catch-up, and a
        slow reader is paced instead of overrunning its send buffer. Live
        frames wait behind the catch-up within their own bound; past it the
        client is closed with 4008 after the last catch-up frame it got, and
        resumes from there."""
        pages, cursor = await self.subscribe(conn, since, CATCH_UP_PAGE, self.settings.send_buffer_max_bytes // 4)
        try:
            page = await anext(pages)
            if conn.closing:
                return
            hello = {"type": "hello", "recovered": page.recovered, "cursor": str(cursor), "user": user}
            conn.transport.write(text_frame(orjson.dumps(hello)))
            while page.more:
                conn.send_page(page.frames)
                if not await conn.drained():
                    return
                if conn.overflowed:  # live frames outran the catch-up: go no further
                    conn.overflow()
                    return
                page = await anext(pages)
                if not page.recovered:
                    # Messages expired while the client read the pages before:
                    # its resume from the last one it got says `recovered: false`.
                    conn.close(CLOSE_TRY_AGAIN, "messages expired during catch-up: reconnect with since")
                    return
            if await conn.drained():
                conn.go_live(page.frames)
        finally:
            await pages.aclose()

    def forget(self, conn: Connection) -> None:
        """A WebSocket is gone (closed either way); idempotent."""
        if conn in self.sockets:
            self.sockets.discard(conn)
            self.hub.unregister(conn)
            metrics.WS_OPEN.dec()

    # --- plain HTTP ------------------------------------------------------------------
    async def handle_http(self, conn: Connection, request: Request) -> None:
        path, query = _split(request.target)
        keep = request.keep_alive
        route = ROUTES.get(path)
        if route is None:
            conn.respond(404, _error_body("not_found", f"no route {path}"), keep)
        elif request.method != "GET":
            conn.respond(405, _error_body("method_not_allowed", f"{request.method} is not allowed here"), keep,
                         {"Allow": "GET"})
        else:
            await route(self, conn, request, query)

    async def poll(self, conn: Connection, request: Request, query: dict[str, str]) -> None:
        keep = request.keep_alive
        headers = self.cors_headers(request.headers.get("origin"))
        try:
            token = auth.bearer(request.headers.get("authorization")) or query.get("token")
            # The WebSocket's checks, origin included. A poll is short: its token need only be valid now.
            user, _expires = self.admit(token, request.headers.get("origin"))
            default = min(POLL_DEFAULT_TIMEOUT, self.settings.poll_max_timeout_seconds)
            timeout = _poll_timeout(query.get("timeout", f"{default:g}"), self.settings.poll_max_timeout_seconds)
            limit = _poll_limit(query.get("limit"), self.settings.poll_max_messages)
        except Refusal as refusal:
            conn.respond(refusal.status, refusal.body(), keep, headers | refusal.headers)
            return
        waiter = PollWaiter(user, 0)
        self.polls.add(waiter)
        metrics.POLLS_WAITING.inc()
        try:
            try:
                pages, cursor = await self.subscribe(waiter, parse_since(query.get("since")), limit,
                                                     self.settings.send_buffer_max_bytes)
                catch = await first_page(pages)
            except Behind:
                metrics.REJECTS.labels("behind").inc()
                conn.respond(503, _error_body("try_again_later", "this daemon is behind your since: retry"),
                             keep, headers | {"Retry-After": "1"})
                return
            if catch.more:
                # Cut at `limit` messages or the byte bound: the answer is this
                # page alone (no live message, which would come after what is
                # left out), and the cursor resumes after it.
                waiter.send_page(catch.frames)
            else:
                waiter.go_live(catch.frames)
            if not waiter.items and timeout > 0 and not self.draining:
                waiter.wake.clear()
                try:
                    await asyncio.wait_for(waiter.wake.wait(), timeout)
                except TimeoutError:
                    pass
        finally:
            self.hub.unregister(waiter)
            self.polls.discard(waiter)
            metrics.POLLS_WAITING.dec()
        items = waiter.items
        if len(items) > limit:  # live messages came on top of the catch-up: the rest waits for the next poll
            items = items[:limit]
            last = items[-1][0]
        elif waiter.overflowed or catch.more:
            last = waiter.last_id
        else:
            last = max(cursor, waiter.last_id)
        body = (b'{"messages":[' + b",".join(payload for _i, payload in items) + b'],"cursor":"'
                + str(last).encode() + b'","recovered":' + (b"true" if catch.recovered else b"false") + b"}")
        conn.respond(200, body, keep, headers)

    def cors_headers(self, origin: str | None) -> dict[str, str]:
        """Lets an allowed web page read poll answers (its fallback when a
        WebSocket cannot be held); a token in the query keeps it a simple request."""
        if origin is None or not self.origin_allowed(origin):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    async def healthz(self, conn: Connection, request: Request, query: dict[str, str]) -> None:
        body = orjson.dumps({"status": "ok" if self.stream.ready.is_set() else "starting", "pid": os.getpid(),
                             "position": str(self.stream.position), "connections": self.hub.count})
        conn.respond(200, body, request.keep_alive)

    async def metrics_endpoint(self, conn: Connection, request: Request, query: dict[str, str]) -> None:
        conn.respond(200, generate_latest(), request.keep_alive, content_type=CONTENT_TYPE_LATEST)

    # --- lifecycle -------------------------------------------------------------------
    async def heartbeats(self) -> None:
        tick = max(0.1, min(1.0, self.settings.ping_interval_seconds / 4, self.settings.ping_timeout_seconds / 4))
        while True:
            await asyncio.sleep(tick)
            self.close_idle_http(time.monotonic())
            conns = list(self.sockets)
            for start in range(0, len(conns), HEARTBEAT_SLICE):
                if start:
                    await asyncio.sleep(0)  # deliveries go first
                now = time.monotonic()
                for conn in conns[start:start + HEARTBEAT_SLICE]:
                    if conn in self.sockets:  # not closed while the loop ran
                        conn.heartbeat(now)

    def close_idle_http(self, now: float) -> None:
        """Closes HTTP connections that have had no request in hand for
        ``http_idle_seconds``: an idle keep-alive, or a request head that
        trickles in (slowloris) or never comes. Each holds a file descriptor."""
        limit = self.settings.http_idle_seconds
        for conn in [c for c in self.http_conns if c.http.task is None and now - c.http.idle_since > limit]:
            metrics.CLOSES.labels("http_idle").inc()
            self.http_conns.discard(conn)
            if conn.transport.get_write_buffer_size():
                conn.transport.abort()  # a client that has not read its last answer for this long: owed nothing
            else:
                conn.transport.close()

    async def drain(self) -> None:
        """SIGTERM: refuse new clients, answer waiting polls now, close every
        WebSocket with 1012 so that clients reconnect elsewhere, and give
        them ``drain_seconds`` to go."""
        self.draining = True
        for waiter in list(self.polls):
            waiter.wake.set()
        for conn in list(self.sockets):
            conn.close(CLOSE_RESTART, "daemon restarting: reconnect with since")
        deadline = time.monotonic() + self.settings.drain_seconds
        while self.polls and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.conns):
            if conn.http is not None and conn.http.task is None:
                conn.transport.close()  # idle keep-alive HTTP
        while self.conns and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # close frames flushing, clients answering


async def _not_a_handshake(daemon: Daemon, conn: Connection, request: Request, query: dict[str, str]) -> None:
    conn.respond(426, _error_body("upgrade_required", "/v1/ws is a WebSocket endpoint"), request.keep_alive,
                 {"Upgrade": "websocket"})


ROUTES = {
    "/v1/poll": Daemon.poll,
    "/v1/ws": _not_a_handshake,  # a plain GET: the handshake is handle_upgrade's
    "/healthz": Daemon.healthz,
    "/metrics": Daemon.metrics_endpoint,
}


async def _one(page: CatchUp) -> AsyncIterator[CatchUp]:
    yield page


def _split(target: bytes) -> tuple[str, dict[str, str]]:
    text = target.decode("latin-1")
    if text.startswith("/"):  # origin form, as clients send: urlsplit was a twentieth of a long-poll's cost
        path, _, query = text.partition("?")
    else:  # absolute form ("http://host/path?query"), as a proxy may send
        url = urllib.parse.urlsplit(text)
        path, query = url.path, url.query
    return path, dict(urllib.parse.parse_qsl(query))


def _poll_timeout(raw: str, limit: float) -> float:
    try:
        timeout = float(raw)
        if 0 <= timeout <= limit:
            return timeout
    except ValueError:
        pass
    raise Refusal(422, "invalid_field", f"`timeout` must be seconds from 0 to {limit:g}", field="timeout")


def _poll_limit(raw: str | None, most: int) -> int:
    if raw is None:
        return most
    if is_decimal(raw, 9) and 1 <= int(raw) <= most:
        return int(raw)
    raise Refusal(422, "invalid_field", f"`limit` must be an integer from 1 to {most}", field="limit")


async def run(settings: Settings, tail=None) -> None:
    """One daemon process: the stream, the listening socket, until SIGTERM.
    ``tail`` replaces the oplog tail (the replay benchmark feeds recorded entries)."""
    loop = asyncio.get_running_loop()
    client = mongo.make_client(settings.mongo_url.get_secret_value(), settings.db_timeout_seconds)
    db = client[settings.mongo_db]
    hub = Hub(settings.send_buffer_max_bytes)
    if tail is None and settings.oplog_relay_socket:
        tail = RelayTail(client, f"{settings.mongo_db}.{mongo.MESSAGES}", settings.oplog_relay_socket)
    elif tail is None:
        tail = OplogTail(client, f"{settings.mongo_db}.{mongo.MESSAGES}", silence_seconds=settings.tail_silence_seconds,
                         ferretdb_poll_seconds=settings.ferretdb_tail_poll_ms / 1000)
    ranges = None
    if settings.fill_holes_from_mysql:  # the engine connects on first use: MySQL need not be up to start
        ranges = StreamRanges(make_engine(settings.mysql_url.get_secret_value(), settings.db_timeout_seconds,
                                          pool_size=1))
    stream = Stream(db, tail, hub, retention_seconds=settings.retention_seconds,
                    cache_max=settings.recent_cache_max, gap_check_seconds=settings.gap_check_seconds,
                    cache_max_bytes=settings.recent_cache_max_bytes, ranges=ranges)
    daemon = Daemon(settings, hub, stream)
    stop = stop_on_signals()
    tasks = [loop.create_task(stream.run(), name="stream"), loop.create_task(daemon.heartbeats(), name="heartbeats")]
    failed: list[BaseException] = []

    def must_not_end(task: asyncio.Task) -> None:
        # Both run for the life of the process. One that ends has failed, and a
        # daemon without its stream would accept clients and deliver nothing:
        # drain and exit non-zero, so that supervisord starts a fresh one.
        if not task.cancelled() and not stop.is_set():
            failed.append(task.exception() or RuntimeError(f"{task.get_name()} ended"))
            log.error("event=task_failed task=%s action=exit", task.get_name(), exc_info=failed[-1])
            stop.set()

    for task in tasks:
        task.add_done_callback(must_not_end)
    # Past the cap, a connection is refused once it sends a request (503, as
    # it should be told); past the ceiling above it, at once, so that silent
    # sockets stop short of the open-files limit.
    ceiling = connection_ceiling(settings.max_connections)
    listener = reuseport_socket(settings.daemon_host, settings.daemon_port, listen=False)
    acceptor = Acceptor(loop, listener, lambda: Connection(daemon),
                        room=lambda accepting: len(daemon.conns) + accepting < ceiling)
    # What exists now (modules, classes, settings: some 60,000 objects) lives
    # as long as the process: out of the cyclic GC's sight, so that its full
    # passes walk only what the connections and messages create since.
    gc.freeze()
    metrics.watch_gc()
    serve_metrics(settings.daemon_host, settings.metrics_port)
    listener.listen(LISTEN_BACKLOG)  # only now: the kernel queues connections for this process from here on
    acceptor.start()
    log.info("event=daemon_started port=%d pid=%d", settings.daemon_port, os.getpid())
    try:
        await stop.wait()
        log.info("event=daemon_draining connections=%d", hub.count)
        exit_by(settings.drain_seconds + SHUTDOWN_GRACE_SECONDS, lambda: 1 if failed else 0, log)
        acceptor.close()
        await daemon.drain()
    finally:
        # Each step bounded: with a store that hangs, the stream's reads clean
        # up by talking to it, and the Mongo client's close asks it to end its
        # sessions, each up to a socket timeout (10 s).
        for task in tasks:
            task.cancel()
        await bounded("tasks", asyncio.gather(*tasks, return_exceptions=True), SHUTDOWN_STEP_SECONDS, log)
        await bounded("mongo_close", client.close(), SHUTDOWN_STEP_SECONDS, log)
        if ranges is not None:
            ranges.close()
        log.info("event=daemon_stopped")
    if failed:
        raise SystemExit(1)
