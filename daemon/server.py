"""The daemon's I/O shell: /v1/ws, /v1/poll, /healthz, /metrics.

It moves data between sockets and the core (hub, stream) and holds no
delivery rules of its own. Close codes clients can see:
  1008 inbound frame rate over the limit      1009 inbound frame too big
  1011 server error                           1012 daemon restarting (reconnect with since)
  4008 slow consumer: the outgoing queue filled (reconnect with since)
Refused handshakes: 401 bad token, 403 origin not allowed, 503 at capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from chat import auth
from chat.settings import Settings
from daemon import metrics
from daemon.hub import CloseReason, Hub, Subscriber
from daemon.oplog import OplogTail
from daemon.stream import CatchUp, Stream
from db import mongo

log = logging.getLogger("chat.daemon")

CLOSE_RATE = 1008
CLOSE_ERROR = 1011
FUTURE_SINCE_WAIT = 2.0  # a `since` from a daemon that is ahead of this one


@dataclass
class DaemonState:
    settings: Settings
    hub: Hub
    stream: Stream
    draining: asyncio.Event = field(default_factory=asyncio.Event)
    polls: set[Subscriber] = field(default_factory=set)


def _json(data, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(data), status, headers, media_type="application/json")


def _error(status: int, code: str, message: str, headers: dict | None = None) -> Response:
    return _json({"error": code, "message": message}, status, headers)


def parse_since(raw: str | None) -> int | None:
    """A resume point: a message id or a hello cursor (both decimal strings)."""
    if raw is None or not raw.isdigit() or len(raw) > 19:
        return None
    return int(raw)


def admit(st: DaemonState, token: str | None, origin: str | None) -> tuple[str | None, Response | None]:
    """Decides a handshake before anything is registered: (user, None) or (None, refusal)."""
    try:
        user = auth.verify(st.settings.jwt_secret.get_secret_value(), token)
    except auth.AuthError as exc:
        metrics.REJECTS.labels("auth").inc()
        return None, _error(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"})
    allowed = st.settings.allowed_origins
    if origin is not None and "*" not in allowed and origin not in allowed:
        metrics.REJECTS.labels("origin").inc()
        return None, _error(403, "origin_not_allowed", f"origin {origin!r} is not allowed")
    if st.hub.count >= st.settings.max_connections or st.draining.is_set():
        metrics.REJECTS.labels("capacity").inc()
        return None, _error(503, "try_again_later", "this daemon is full or restarting; retry",
                            {"Retry-After": "1"})
    return user, None


async def subscribe(st: DaemonState, user: str, since: int | None, wake) -> tuple[Subscriber, CatchUp, int]:
    """Registers a subscriber and computes its catch-up; returns (sub, catch-up, cursor).

    The stream position is read and the subscriber registered with no await
    in between: catch-up covers (since, position], live frames cover the rest.
    """
    await st.stream.ready.wait()
    position = st.stream.position
    sub = Subscriber(user, wake, since if since is not None else position)
    st.hub.register(sub)
    if since is None:
        return sub, CatchUp(False, []), position
    recovered = True
    if since > position:
        recovered = await st.stream.wait_for(since, FUTURE_SINCE_WAIT)
    catch = await st.stream.catch_up(user, since, position)
    catch.recovered = catch.recovered and recovered
    return sub, catch, max(position, since) if recovered else position


async def ws_endpoint(websocket: WebSocket) -> None:
    st: DaemonState = websocket.app.state.daemon
    token = websocket.query_params.get("token") or auth.bearer(websocket.headers.get("authorization"))
    user, refusal = admit(st, token, websocket.headers.get("origin"))
    if refusal is not None:
        await websocket.send_denial_response(refusal)
        return
    since = parse_since(websocket.query_params.get("since"))
    await websocket.accept()
    wake = asyncio.Event()
    sub: Subscriber | None = None
    receiver = None
    metrics.CONNECTIONS.labels("ws").inc()
    try:
        sub, catch, cursor = await subscribe(st, user, since, wake.set)
        hello = {"type": "hello", "recovered": catch.recovered,
                 "cursor": str(cursor), "user": user}
        await websocket.send_text(orjson.dumps(hello).decode())
        sub.go_live(catch.frames)
        receiver = asyncio.create_task(_receive(websocket, st.settings, wake))
        await _send_loop(websocket, sub, wake, receiver)
    except WebSocketDisconnect:
        pass
    except Exception:
        log.exception("event=ws_error user=%s", user)
        await _close(websocket, CLOSE_ERROR, "server error")
    finally:
        if receiver is not None:
            receiver.cancel()
        if sub is not None:
            st.hub.unregister(sub)
        metrics.CONNECTIONS.labels("ws").dec()


async def _send_loop(websocket: WebSocket, sub: Subscriber, wake: asyncio.Event, receiver: asyncio.Task) -> None:
    while not receiver.done():
        if sub.overflowed:
            metrics.CLOSES.labels("slow_consumer").inc()
            await _close(websocket, CloseReason.SLOW_CONSUMER.value, "slow consumer: reconnect with since")
            return
        items = sub.take()
        if not items:
            wake.clear()
            if not sub.queue and not sub.overflowed:
                await wake.wait()
            continue
        for _msg_id, frame, received in items:
            await websocket.send_text(frame)
            if received is not None:
                metrics.OPLOG_TO_SOCKET.observe(time.perf_counter() - received)
        metrics.SENT.labels("ws").inc(len(items))


async def _receive(websocket: WebSocket, settings: Settings, wake: asyncio.Event) -> None:
    """Reads what the client sends (nothing is expected) and enforces the
    inbound rate; the frame-size limit is enforced by the protocol (1009)."""
    window_start, count = time.monotonic(), 0
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            now = time.monotonic()
            if now - window_start >= 1.0:
                window_start, count = now, 0
            count += 1
            if count > settings.ws_max_frames_per_second:
                metrics.CLOSES.labels("frame_rate").inc()
                await _close(websocket, CLOSE_RATE, "too many frames")
                return
    finally:
        wake.set()  # let the send loop see that the socket is done


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await websocket.close(code, reason)


def cors_headers(settings: Settings, origin: str | None) -> dict[str, str]:
    """Lets an allowed browser origin read a /v1/poll answer (a CORS simple GET, token in the query)."""
    if origin is None or ("*" not in settings.allowed_origins and origin not in settings.allowed_origins):
        return {"Vary": "Origin"}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


async def poll(request: Request) -> Response:
    st: DaemonState = request.app.state.daemon
    token = auth.bearer(request.headers.get("authorization")) or request.query_params.get("token")
    user, refusal = admit(st, token, None)
    if refusal is not None:
        return refusal
    since = parse_since(request.query_params.get("since"))
    raw_timeout = request.query_params.get("timeout", "25")
    try:
        timeout = float(raw_timeout)
        if not 0 <= timeout <= st.settings.poll_max_timeout_seconds:
            raise ValueError
    except ValueError:
        return _error(422, "invalid_field", f"`timeout` must be seconds from 0 to "
                                            f"{st.settings.poll_max_timeout_seconds:g}")
    wake = asyncio.Event()
    sub, catch, cursor = await subscribe(st, user, since, wake.set)
    st.polls.add(sub)
    metrics.CONNECTIONS.labels("poll").inc()
    try:
        sub.go_live(catch.frames)
        items = sub.take()
        if not items and timeout > 0 and not st.draining.is_set():
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)
            items = sub.take()
    finally:
        st.hub.unregister(sub)
        st.polls.discard(sub)
        metrics.CONNECTIONS.labels("poll").dec()
    limit = st.settings.poll_max_messages
    truncated = len(items) > limit
    if truncated:  # bounded answers: the client pages with the cursor
        items = items[:limit]
        sub.last_id = items[-1][0]
    metrics.SENT.labels("poll").inc(len(items))
    last = sub.last_id if truncated else max(cursor, sub.last_id)
    body = (b'{"messages":[' + ",".join(frame for _i, frame, _r in items).encode() + b'],"cursor":"'
            + str(last).encode() + b'","recovered":' + (b"true" if catch.recovered else b"false") + b"}")
    return Response(body, headers=cors_headers(st.settings, request.headers.get("origin")),
                    media_type="application/json")


async def healthz(request: Request) -> Response:
    st: DaemonState = request.app.state.daemon
    return _json({"status": "ok" if st.stream.ready.is_set() else "starting", "pid": os.getpid(),
                  "position": str(st.stream.position), "connections": st.hub.count})


async def metrics_endpoint(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def create_app(settings: Settings) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        client = mongo.make_client(settings.mongo_url.get_secret_value(), settings.db_timeout_seconds)
        db = client[settings.mongo_db]
        hub = Hub(settings.send_queue_max)
        tail = OplogTail(client, f"{settings.mongo_db}.{mongo.MESSAGES}",
                         silence_seconds=settings.tail_silence_seconds)
        stream = Stream(db, tail, hub, retention_seconds=settings.retention_seconds,
                        cache_max=settings.recent_cache_max, gap_check_seconds=settings.gap_check_seconds)
        app.state.daemon = DaemonState(settings, hub, stream)
        task = asyncio.create_task(stream.run(), name="stream")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()

    return Starlette(routes=[
        WebSocketRoute("/v1/ws", ws_endpoint),
        Route("/v1/poll", poll, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ], lifespan=lifespan)


def start_draining(app: Starlette) -> None:
    """SIGTERM: refuse new clients, answer waiting polls now; uvicorn then
    closes every WebSocket with 1012 and the clients reconnect elsewhere."""
    st: DaemonState | None = getattr(app.state, "daemon", None)
    if st is None:
        return
    st.draining.set()
    for sub in list(st.polls):
        sub._wake()
