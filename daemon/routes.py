"""The daemon's routes: ``/v1/ws`` (``daemon.websocket``), ``/v1/poll``,
``/healthz`` and ``/metrics``, and ``Router``, the handler its connections
are given (``daemon.connection.Handler``).

They move data between sockets and the core (``daemon.hub``,
``daemon.stream``) and hold no delivery rules of their own. A poll is
refused as a WebSocket is (``daemon.admission``), a client of a partition
this daemon does not serve with 421 and its partition; a daemon that has not
reached its ``since`` within 2 s answers 503.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chat.errors import Refused, error_body
from daemon import admission, metrics, websocket
from daemon.admission import (
    cors_headers,
    poll_limit,
    poll_timeout,
    split_target,
)
from daemon.catchup import first_page
from daemon.client_frames import ClientFrames
from daemon.connection import Connection
from daemon.http_phase import Request
from daemon.server import Behind, Daemon, PollWaiter
from daemon.store_reads import STORE_ERRORS

log = logging.getLogger("chat.daemon")

POLL_DEFAULT_TIMEOUT = 25.0  # seconds, when a poll names none (and the cap allows it)

Route = Callable[[Daemon, Connection, Request, dict[str, str]], Awaitable[None]]


class Router:
    """What the daemon's connections ask of it: a ``daemon.connection.Handler``."""

    __slots__ = ("daemon",)

    def __init__(self, daemon: Daemon):
        self.daemon = daemon

    async def handle_upgrade(self, conn: Connection, request: Request) -> bool:
        return await websocket.handle_upgrade(self.daemon, conn, request)

    async def handle_http(self, conn: Connection, request: Request) -> None:
        path, query = split_target(request.target)
        keep = request.keep_alive
        route = ROUTES.get(path)
        if route is None:
            conn.respond(404, error_body("not_found", f"no route {path}"), keep)
        elif request.method == "OPTIONS" and path == "/v1/poll":
            preflight(self.daemon, conn, request)
        elif request.method != "GET":
            conn.respond(405, error_body("method_not_allowed", f"{request.method} is not allowed here"), keep,
                         {"Allow": "GET, OPTIONS" if path == "/v1/poll" else "GET"})
        else:
            await route(self.daemon, conn, request, query)

    def forget(self, conn: Connection) -> None:
        self.daemon.forget(conn)

    def client_frames(self, conn: Connection) -> ClientFrames:
        writer = self.daemon.writer
        return ClientFrames(conn.subscriber.user, conn.device, None if writer is None else writer.submit,
                            conn.send_text, signals=self.daemon.signals, conn=conn)


async def poll(daemon: Daemon, conn: Connection, request: Request, query: dict[str, str]) -> None:
    settings, keep = daemon.settings, request.keep_alive
    headers = cors_headers(settings, request.headers.get("origin"))
    try:
        token = admission.credential(settings, query, request.headers.get("authorization"))
        # The WebSocket's checks, origin included. A poll is short: its token need only be valid now.
        user, _expires = daemon.admit(token, request.headers.get("origin"))
        partition = daemon.partition_of(user, query.get("partition"))
        default = min(POLL_DEFAULT_TIMEOUT, settings.daemon.poll_max_timeout_seconds)
        timeout = poll_timeout(query.get("timeout", f"{default:g}"), settings.daemon.poll_max_timeout_seconds)
        limit = poll_limit(query.get("limit"), settings.daemon.poll_max_messages)
    except Refused as refusal:
        conn.respond(refusal.status, refusal.body(), keep, headers | refusal.headers)
        return
    waiter = PollWaiter(user, 0, partition)
    sub = waiter.subscriber
    daemon.polls.add(waiter)
    metrics.POLLS_WAITING.inc()
    signals = daemon.signals
    if signals is not None:  # a waiting poll is a connection: its user is online
        signals.arrive(user)
    try:
        try:
            pages, cursor = await daemon.subscribe(sub, daemon.resume_point(query.get("since"), user), limit,
                                                   settings.daemon.send_buffer_max_bytes)
            catch = await first_page(pages)
        except Behind as exc:
            metrics.REJECTS.labels(exc.reason).inc()
            conn.respond(503, error_body("try_again_later", "this daemon is behind your since: retry"),
                         keep, headers | {"Retry-After": "1"})
            return
        except STORE_ERRORS as exc:
            metrics.REJECTS.labels("store_unavailable").inc()
            log.warning("event=catchup_store_unavailable user=%s error=%s action=respond_503", user,
                        exc.__class__.__name__)
            conn.respond(503, error_body("try_again_later", "the message store did not answer in time: retry"),
                         keep, headers | {"Retry-After": "1"})
            return
        if catch.more:
            # Cut at `limit` messages or the byte bound: the answer is this
            # page alone (no live message, which would come after what is
            # left out), and the cursor resumes after it.
            sub.send_page(catch.frames)
        else:
            sub.go_live(catch.frames)
        # Not after a drain's wake, nor a hand-over's (its user's slot moved: ``daemon.handover``).
        if not waiter.items and timeout > 0 and not daemon.draining and daemon.still_serves(user, partition):
            waiter.wake.clear()
            try:
                await asyncio.wait_for(waiter.wake.wait(), timeout)
            except TimeoutError:
                pass
    finally:
        daemon.unsubscribe(sub)
        sub.detach()
        daemon.polls.discard(waiter)
        metrics.POLLS_WAITING.dec()
        if signals is not None:
            signals.leave(user)
    items = waiter.items
    if len(items) > limit:  # live messages came on top of the catch-up: the rest waits for the next poll
        items = items[:limit]
        last = items[-1][0]
    elif sub.overflowed or catch.more:
        last = sub.last_id
    else:
        last = max(cursor, sub.last_id)
    unread = await daemon.unread(user, partition)
    body = (b'{"messages":[' + b",".join(payload for _i, payload in items) + b'],"cursor":"'
            + daemon.cursor(partition, last).encode() + b'","recovered":'
            + (b"true" if catch.recovered else b"false") + b',"unread":' + orjson.dumps(unread)
            + b',"signals":[' + b",".join(waiter.signals) + b"]}")
    conn.respond(200, body, keep, headers)


def preflight(daemon: Daemon, conn: Connection, request: Request) -> None:
    """A browser asks whether its page may send ``Authorization`` to /v1/poll."""
    headers = admission.preflight_headers(daemon.settings, request.headers.get("origin"))
    if headers is None:
        conn.respond(403, error_body("origin_not_allowed", "this origin may not read /v1/poll"), request.keep_alive)
    else:
        conn.respond(204, b"", request.keep_alive, headers)


async def healthz(daemon: Daemon, conn: Connection, request: Request, query: dict[str, str]) -> None:
    stream = daemon.stream
    status: dict[str, object] = {"status": "ok" if daemon.ready else "starting", "pid": os.getpid(),
              "position": str(stream.position if stream is not None else 0), "connections": daemon.hub.count}
    if len(daemon.streams) > 1 or daemon.slot_map.partitions > 1:
        # "position" is the first served partition's; these are every served one's, as cursors
        status["partitions"] = {str(k): daemon.cursor(k, s.position) for k, s in sorted(daemon.streams.items())}
    body = orjson.dumps(status)
    conn.respond(200, body, request.keep_alive)


async def metrics_endpoint(daemon: Daemon, conn: Connection, request: Request, query: dict[str, str]) -> None:
    conn.respond(200, generate_latest(), request.keep_alive, content_type=CONTENT_TYPE_LATEST)


async def not_a_handshake(daemon: Daemon, conn: Connection, request: Request, query: dict[str, str]) -> None:
    conn.respond(426, error_body("upgrade_required", "/v1/ws is a WebSocket endpoint"), request.keep_alive,
                 {"Upgrade": "websocket"})


ROUTES: dict[str, Route] = {
    "/v1/poll": poll,
    "/v1/ws": not_a_handshake,  # a plain GET: the handshake is handle_upgrade's
    "/healthz": healthz,
    "/metrics": metrics_endpoint,
}
