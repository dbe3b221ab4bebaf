"""``/v1/ws``: the handshake, the admission, the hello, the catch-up a page
at a time, then live frames.

A client of a partition this daemon does not serve gets 421 and its
partition, before any upgrade (or 4421 after it, when its token came in its
first frame). A daemon that has not reached the client's
``since`` within 2 s closes with 1013; so does a catch-up the stores do not answer in time, and one
that meets expired messages (the client resumes and is told ``recovered: false``); a WebSocket whose token
expires is closed with 4001 by the heartbeat (``daemon.lifecycle``); one
whose user's slot moves to another partition, with 1012 (``daemon.handover``).
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson

from chat.errors import CloseCode, Refused, error_body
from daemon import admission, handshake, metrics
from daemon.admission import split_target
from daemon.client_frames import device_of
from daemon.connection import Connection
from daemon.http_phase import Request
from daemon.hub import Subscriber
from daemon.server import Behind, Daemon
from daemon.store_reads import STORE_ERRORS

log = logging.getLogger("chat.daemon")

# A WebSocket catch-up goes out in pages of at most this many messages (and a
# quarter of the send buffer's bound), each once the socket has sent most of
# the page before: a client resuming from far back costs one page of memory,
# not its whole backlog, and a slow reader is paced instead of cut off (4008).
CATCH_UP_PAGE = 1000
# The close reason of a user whose slot moved to another partition (``daemon.handover``).
SLOT_MOVED = "your partition moved: reconnect with since"


async def handle_upgrade(daemon: Daemon, conn: Connection, request: Request) -> bool:
    """The WebSocket handshake; True once the connection is a WebSocket.

    The token comes in ``Authorization`` (clients that can set headers), or,
    for browsers, which cannot, in the first frame after the upgrade:
    ``{"type": "auth", "token": "<jwt>"}``. Never in the URL by default: a
    URL is written whole to proxies' error logs."""
    path, query = split_target(request.target)
    if path != "/v1/ws":
        conn.respond(404, error_body("not_found", f"no route {path}"), False)
        return False
    response = handshake.accept(conn, path, request)
    if response is None:
        return False
    origin = request.headers.get("origin")
    device = device_of(query.get("device"))
    if device is None:
        conn.respond(422, error_body("invalid_field", "`device` must be 1-64 chars of [A-Za-z0-9_.-], not . or ..",
                                     "device"),
                     False)
        return False
    conn.device = device
    try:
        token = admission.credential(daemon.settings, query, request.headers.get("authorization"))
        if token is None:
            daemon.admit_connection(origin)
        else:
            user, expires = daemon.admit(token, origin)
            partition = daemon.partition_of(user, query.get("partition"))
    except Refused as refusal:
        conn.respond(refusal.status, refusal.body(), False, refusal.headers)
        return False
    if conn.closing:
        return True
    if token is None:
        conn.upgrade(response, identify=True)
        identified = await identify(daemon, conn, query.get("partition"))
        if identified is None:
            return True
        user, expires, partition = identified
        unread = await daemon.unread(user, partition)
    else:
        # Read before the upgrade: the hello is the first frame a client gets,
        # before even the pong to a ping it sends at once (Autobahn's live cases).
        unread = await daemon.unread(user, partition)
        if conn.closing:
            return True
        conn.upgrade(response, with_hello=True)
    if not daemon.still_serves(user, partition):
        # The user's slot moved while the unread count (or the auth frame) was awaited: the
        # hand-over has closed its other sockets, and this one goes the same way.
        metrics.CLOSES.labels("slot_moved").inc()
        conn.close(CloseCode.RESTART, SLOT_MOVED)
        return True
    # Its delivery state, once user and partition are known: the hub it joins is its partition's.
    # From here to its registration in that hub nothing is awaited (``serve_socket``).
    conn.subscriber = Subscriber(conn, user, partition=partition)
    # One number per socket; the heartbeat closes it with 4001 once it is past.
    conn.expires = time.monotonic() + (expires - time.time())
    daemon.join(conn)  # due for its heartbeat at its first ping, or at exp if sooner
    metrics.WS_OPEN.inc()
    try:
        await serve_socket(daemon, conn, user, daemon.resume_point(query.get("since"), user), unread)
    except Behind as exc:
        metrics.REJECTS.labels(exc.reason).inc()
        conn.close(CloseCode.TRY_AGAIN, "this daemon is behind your since: retry")
    except STORE_ERRORS as exc:
        # A catch-up page the stores did not give in time: the client resumes from the last id it got.
        metrics.REJECTS.labels("store_unavailable").inc()
        log.warning("event=catchup_store_unavailable user=%s error=%s action=close_1013", user,
                    exc.__class__.__name__)
        conn.close(CloseCode.TRY_AGAIN, "the message store did not answer in time: retry")
    except Exception:
        log.exception("event=ws_error user=%s", user)
        conn.close(CloseCode.SERVER_ERROR, "server error")
    return True


async def identify(daemon: Daemon, conn: Connection, asked_partition: str | None) -> tuple[str, float, int] | None:
    """The user, the token's ``exp`` and the partition of a socket's first
    message, an ``auth`` frame; None once the socket is closed instead: 4401
    for no such frame within ``ws_auth_seconds`` or a bad token, 4421 and the
    user's partition for a user this daemon does not serve."""
    try:
        first = await asyncio.wait_for(conn.first_message(), daemon.settings.daemon.ws_auth_seconds)
    except TimeoutError:
        first = None
        reason = f"no auth frame within {daemon.settings.daemon.ws_auth_seconds:g} s"
    if conn.closing:
        return None
    try:
        if first is None:
            raise Refused(401, "unauthorized", reason)
        user, expires = daemon.verify(auth_frame_token(first))
        return user, expires, daemon.partition_of(user, asked_partition)
    except Refused as refusal:
        if refusal.status == 421:
            conn.close(CloseCode.WRONG_PARTITION, orjson.dumps(refusal.extra).decode())
        else:
            metrics.CLOSES.labels("unauthorized").inc()
            conn.close(CloseCode.UNAUTHORIZED, refusal.message[:120])
        return None


def auth_frame_token(data: bytes) -> str:
    """The token of an ``auth`` frame's payload, or ``Refused`` 401 saying what is wrong with it."""
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError:
        frame = None
    if not isinstance(frame, dict) or frame.get("type") != "auth" or not isinstance(frame.get("token"), str):
        raise Refused(401, "unauthorized", 'the first frame must be {"type": "auth", "token": "<jwt>"}')
    return frame["token"]


async def serve_socket(daemon: Daemon, conn: Connection, user: str, since: int | None, unread: int | None) -> None:
    """The hello, the catch-up a page at a time, then live frames.

    Each page goes out once the socket has sent most of the one before
    (``drained``), so the daemon holds one page of a long catch-up, and a
    slow reader is paced instead of overrunning its send buffer. Live
    frames wait behind the catch-up within their own bound; past it the
    client is closed with 4008 after the last catch-up frame it got, and
    resumes from there."""
    sub = conn.subscriber
    pages, cursor = await daemon.subscribe(sub, since, CATCH_UP_PAGE, daemon.settings.daemon.send_buffer_max_bytes // 4)
    try:
        page = await anext(pages)
        if conn.closing:
            return
        conn.send_text(orjson.dumps({"type": "hello", "recovered": page.recovered,
                                     "cursor": daemon.cursor(sub.partition, cursor), "user": user,
                                     "unread": unread}))
        while page.more:
            sub.send_page(page.frames)
            if not await conn.drained():
                return
            if sub.overflowed:  # live frames outran the catch-up: go no further
                conn.overflow()
                return
            page = await anext(pages)
            if not page.recovered:
                # Messages expired while the client read the pages before:
                # its resume from the last one it got says `recovered: false`.
                conn.close(CloseCode.TRY_AGAIN, "messages expired during catch-up: reconnect with since")
                return
        if await conn.drained():
            sub.go_live(page.frames)
    finally:
        await pages.aclose()
