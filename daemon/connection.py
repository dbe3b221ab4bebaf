"""One client socket of a daemon: HTTP/1.1 until it upgrades, then a WebSocket.

This is the whole per-connection state, kept small on purpose (an idle
WebSocket costs a few KB, docs/decisions/hand-written-wire.md): no task, no queue and
no protocol object per connection once it is live. Frames the hub offers
are held until the loop's next turn and written to the transport then, all
of a connection's in one write (``ServerState.flush``); the transport's
unsent bytes are the send buffer, bounded by ``CHAT_SEND_BUFFER_MAX_BYTES``.

A connection knows its server only as a ``ServerState`` and a ``Handler``:
routing and admission live in the handler (``daemon.routes``); the
delivery bookkeeping is the ``daemon.hub.Subscriber`` it holds once it is a
WebSocket, whose sink it is; what a client sends is judged by
``daemon.inbound``. Close codes (``chat.errors.CloseCode``): a client's
close is answered with its own code; 1002 protocol error, 1007 text or a
close reason that is not UTF-8, 1008 inbound frame rate, 1009 inbound frame
too big, 1011 server error, 1012 restarting, 1013 behind the client's since,
or the stores slow (retry), 4001 token expired, 4008 slow consumer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Protocol, cast

import httptools

from chat.errors import CloseCode, error_body
from chat.settings import Settings
from daemon import metrics
from daemon.http_checks import parser_refusal, refusal
from daemon.http_phase import HttpPhase, Request
from daemon.hub import Subscriber
from daemon.client_frames import DEFAULT_DEVICE, BadClientFrame, ClientFrames
from daemon.inbound import FRAGMENT, Control, Ending, Inbound, DataMessage
from daemon.wire import PING, Opcode, close_frame, http_response, pong_frame, text_frame

log = logging.getLogger("chat.daemon")

# Said when a request head outgrows REQUEST_HEAD_MAX, and when serving a request fails.
HEAD_TOO_LARGE = error_body("headers_too_large", "request head over 16 KiB")
SERVER_ERROR = error_body("server_error", "internal error")
REQUEST_HEAD_MAX = 16 * 1024  # a request line and headers larger than this get 431
PIPELINE_MAX = 16  # parsed requests waiting on one connection before reading pauses
# Connections holding unwritten frames past which they are all written at once
# (``ServerState.flush``): a few ms of the consumer's work at most.
CORK_MAX = 1024


class ServerState:
    """What the connections of one server share (as uvicorn's ``ServerState``):
    its settings, the open connections, which each connection counts itself
    into and out of, and whether the server is draining."""

    __slots__ = ("settings", "conns", "http_conns", "draining", "corked")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.conns: set[Connection] = set()  # every open connection: the cap, the drain
        self.http_conns: set[Connection] = set()  # those not (yet) WebSockets: the idle sweep
        self.draining = False  # answers go out with `Connection: close`
        # The connections holding frames for the flush at the loop's next turn (``Connection.send``).
        self.corked: list[Connection] = []

    def flush(self) -> None:
        """Writes what every corked connection holds, each in one write: once
        the loop next runs its callbacks, after whatever batches the stream's
        consumer takes meanwhile (it takes every batch queued before it yields).
        A socket given several messages by then costs one ``write()``, one
        system call, instead of one each (on loopback that call also runs the
        receiver's TCP, most of a message's cost). Past ``CORK_MAX``
        connections they are written at once, so that a backlog taken in one
        go is not held back until its end."""
        corked, self.corked = self.corked, []
        limit = self.settings.daemon.send_buffer_max_bytes
        for conn in corked:
            # ``Connection.flush``, inline: this runs for every write of a live message.
            out, conn.out = conn.out, None
            if out is None or conn.closing:  # written or dropped meanwhile (a close, a catch-up's wait)
                continue
            transport = conn.transport
            if transport.is_closing():
                continue
            try:
                transport.write(b"".join(out) if isinstance(out, list) else out)
            except Exception:
                # Here no caller would see it: the connections after this one would keep
                # their frames unwritten. This one is cut off, and resumes with since.
                log.exception("event=ws_write_failed action=abort")
                transport.abort()
                continue
            if transport.get_write_buffer_size() > limit:
                conn.subscriber.overflowed = True
                conn.overflow()


class Handler(Protocol):
    """What a connection asks of its server: the routes, and the news that a WebSocket is gone."""

    async def handle_upgrade(self, conn: Connection, request: Request) -> bool:
        """A WebSocket handshake; True once ``conn`` is a WebSocket (nothing after it is HTTP)."""
        ...

    async def handle_http(self, conn: Connection, request: Request) -> None:
        """A plain request; answered with ``conn.respond``."""
        ...

    def forget(self, conn: Connection) -> None:
        """A WebSocket is gone (closed either way); called once or more."""
        ...

    def client_frames(self, conn: Connection) -> ClientFrames:
        """Where a subscribed WebSocket's client frames go (made at its first one)."""
        ...


class Connection(asyncio.Protocol):
    __slots__ = ("state", "handler", "transport", "subscriber", "http", "reader", "ping_sent", "next_ping",
                 "window_start", "window_count", "closing", "write_paused", "drain_waiter", "expires", "first",
                 "device", "client_frames", "out")
    # Set by connection_made: a connection counted in ``ServerState.conns``
    # may not have one yet, those in ``http_conns`` or among the WebSockets do.
    transport: asyncio.Transport
    # Set once the WebSocket's user and partition are known (``daemon.websocket``),
    # before it is subscribed: an HTTP connection, or a WebSocket still waiting
    # for its ``auth`` frame, carries no delivery state.
    subscriber: Subscriber

    def __init__(self, state: ServerState, handler: Handler):
        self.state = state
        self.handler = handler
        self.http: HttpPhase | None = HttpPhase()
        self.reader: Inbound | None = None  # exists only while a frame or a fragmented message is unfinished
        self.ping_sent = 0.0  # monotonic time of the unanswered ping, 0 if none
        self.next_ping = 0.0
        self.window_start = 0.0
        self.window_count = 0
        self.closing = False
        self.write_paused = False  # the transport holds more than its high-water mark
        self.drain_waiter: asyncio.Future | None = None  # a paged catch-up waiting for it to drain
        self.expires = math.inf  # monotonic time the WebSocket's token expires (set at the upgrade)
        # A WebSocket that sends its token in its first message waits for it here (None: not waiting)
        self.first: asyncio.Future[bytes | None] | None = None
        self.device = DEFAULT_DEVICE  # the device its acks count for (the handshake's `device`)
        self.client_frames: ClientFrames | None = None  # made at its first ack or read frame
        # Frames given since the loop's last turn, written together at its next
        # (``ServerState.flush``): one frame, or a list once there are several.
        self.out: bytes | list[bytes] | None = None
        # Counted from the moment it exists, not from connection_made: the
        # acceptor counts a socket until its protocol is made, and the two
        # counts must meet with no gap (a burst of accepts slipped through it).
        state.conns.add(self)

    # --- asyncio.Protocol ---------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream socket's: it reads and writes
        self.state.http_conns.add(self)

    def data_received(self, data: bytes) -> None:
        if self.http is not None:
            self._http_data(self.http, data)
        elif not self.closing:
            self._ws_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.out = None
        self._wake_drain_waiter()
        if self.first is not None and not self.first.done():
            self.first.set_result(None)
        if self.client_frames is not None:
            self.client_frames.close()
        self.state.conns.discard(self)
        self.state.http_conns.discard(self)
        if self.http is not None:
            if self.http.task is not None:
                self.http.task.cancel()
            self.http = None
        else:
            self.handler.forget(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_drain_waiter()

    def _wake_drain_waiter(self) -> None:
        waiter, self.drain_waiter = self.drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drained(self) -> bool:
        """Waits until the transport is below its low-water mark; False if the
        connection is closing. A peer that stops reading meanwhile is dropped by
        the heartbeat (its pong cannot come), which ends the wait. What is corked
        is written first: a catch-up page is paced by what the socket holds."""
        self.flush()
        if self.write_paused and not self.closing:
            self.drain_waiter = asyncio.get_running_loop().create_future()
            await self.drain_waiter
        return not self.closing

    # --- HTTP ---------------------------------------------------------------
    def _http_data(self, http: HttpPhase, data: bytes) -> None:
        http.head_bytes += len(data)
        if http.head_bytes > REQUEST_HEAD_MAX:
            self.respond(431, HEAD_TOO_LARGE, False)
            return
        try:
            http.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            http.rest = data[upgrade.args[0]:]
            self.transport.pause_reading()  # the handshake decides what comes next
        except httptools.HttpParserError as exc:
            refused = parser_refusal(str(exc))
            self.respond(refused.status, refused.body(), False)
            return
        if http.requests and http.task is None:
            http.task = asyncio.get_running_loop().create_task(self._serve_http(http))
        if len(http.requests) >= PIPELINE_MAX:
            self.transport.pause_reading()

    async def _serve_http(self, http: HttpPhase) -> None:
        try:
            while http.requests and not self.closing:
                request = http.requests.popleft()
                refused = refusal(request.method, request.version, request.headers, request.upgrade)
                if refused is not None:  # the RFCs' refusals, before any routing
                    self.respond(refused.status, refused.body(), False, refused.headers)
                    return
                if request.upgrade and await self.handler.handle_upgrade(self, request):
                    return  # a WebSocket now; nothing after the upgrade is HTTP
                if not request.upgrade:
                    await self.handler.handle_http(self, request)
                if not request.keep_alive or request.upgrade:
                    self.transport.close()
                    return
                self.transport.resume_reading()
        except Exception:
            log.exception("event=http_error")
            self.respond(500, SERVER_ERROR, False)
        finally:
            if self.http is http:
                http.task = None
                http.idle_since = time.monotonic()

    def idle_since(self) -> float | None:
        """Monotonic time since which this HTTP connection has had no request
        in hand; None while it has one, or once it is a WebSocket."""
        http = self.http
        if http is None or http.task is not None:
            return None
        return http.idle_since

    def close_idle(self, abort_unread: bool) -> None:
        """Closes this connection, idle between requests. ``abort_unread``: a
        client that has not read its last answer is owed nothing and is cut
        off at once; else what is unsent still goes out first."""
        if abort_unread and self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    def respond(self, status: int, body: bytes, keep_alive: bool, headers: dict | None = None,
                content_type: str = "application/json") -> None:
        keep_alive = keep_alive and not self.state.draining
        if not self.transport.is_closing():
            self.transport.write(http_response(status, body, content_type, headers, keep_alive))
            if not keep_alive:
                self.transport.close()

    def upgrade(self, response: bytes, identify: bool = False, with_hello: bool = False) -> None:
        """Switches to WebSocket: the 101 goes out, the HTTP state is dropped.
        ``identify``: the user is not known yet, and the first message will say
        (``first_message``). ``with_hello``: the 101 is held and goes out with
        the hello, in the same write (``send_text``), or before whatever else is
        written first (a close, a ping): one system call per connect fewer, on
        loopback a tenth of a connect's CPU. Nothing is corked behind it before
        the hello: live frames wait in the subscriber until ``go_live``, typing
        goes to live sockets only, and a client sends nothing (a presence watch)
        before it has the 101."""
        if identify:
            self.first = asyncio.get_running_loop().create_future()
        http = self.http
        assert http is not None, "an upgrade is answered in the HTTP phase"
        rest = http.rest
        self.http = None
        self.state.http_conns.discard(self)
        # Paged catch-ups wait for the buffer to fall under low before their
        # next page, and a page is at most a quarter of the bound: catch-up
        # alone never trips the slow-consumer close.
        limit = self.state.settings.daemon.send_buffer_max_bytes
        self.transport.set_write_buffer_limits(high=limit // 2, low=limit // 8)
        if with_hello:
            self.out = response
        else:
            self.transport.write(response)
        self.next_ping = time.monotonic() + self.state.settings.daemon.ping_interval_seconds
        self.transport.resume_reading()
        if rest:
            self._ws_data(rest)

    # --- WebSocket: frames out ------------------------------------------------
    def send_text(self, payload: bytes) -> None:
        """One text frame, written now, in one write with what is corked before it (the hello
        after its held 101, before a catch-up; an answer to a client frame)."""
        frame = text_frame(payload)
        out = self.out
        if out is None:
            if not self.closing and not self.transport.is_closing():
                self.transport.write(frame)
            return
        if isinstance(out, list):
            out.append(frame)
        else:
            self.out = [out, frame]
        self.flush()

    # send and overflow: what its subscriber calls, as its ``daemon.hub.Sink``
    def send(self, msg_id: int, payload: bytes, frame: bytes | None) -> None:
        """Corks the message's frame: it is written with the others this
        connection gets in the same turn of the loop, each its own WebSocket
        frame, in order, in one ``write()`` (``ServerState.flush``)."""
        if self.closing:  # nothing after the close frame (a catch-up can outlast its connection)
            return
        if frame is None:
            frame = text_frame(payload)
        out = self.out
        if out is None:
            # The first frame alone, not in a list: most sockets get one message a turn.
            self.out = frame
            # Scheduled once a turn: the flush at the loop's next turn.
            corked = self.state.corked
            if not corked:
                asyncio.get_running_loop().call_soon(self.state.flush)
            corked.append(self)
            if len(corked) >= CORK_MAX:
                self.state.flush()
        elif isinstance(out, list):
            out.append(frame)
        else:
            self.out = [out, frame]

    def flush(self) -> None:
        """Writes the corked frames now, in one ``write()``; past the send
        buffer's bound the socket is closed with 4008 after them (a gap-free
        prefix). ``ServerState.flush`` does the same for every corked connection."""
        out, self.out = self.out, None
        if out is None or self.closing:
            return
        transport = self.transport
        # Not on a transport the peer closed whose connection_lost is still to come: uvloop raises on that write.
        if transport.is_closing():
            return
        # One buffer: uvloop sends a single one with one send(), and joining a few
        # frames costs less than handing it a list (its writev path; measured alike).
        transport.write(b"".join(out) if isinstance(out, list) else out)
        if transport.get_write_buffer_size() > self.state.settings.daemon.send_buffer_max_bytes:
            self.subscriber.overflowed = True
            self.overflow()

    def signal(self, payload: bytes) -> None:
        """A typing or presence event: written as a message is, under the same send-buffer bound."""
        self.send(0, payload, None)

    def overflow(self) -> None:
        if not self.closing:
            metrics.CLOSES.labels("slow_consumer").inc()
            self.close(CloseCode.SLOW_CONSUMER, "slow consumer: reconnect with since")

    # --- WebSocket: what the client sends -------------------------------------
    def new_inbound(self) -> Inbound:
        # Messages are read whole: the first may be the `auth` frame, and the rest are acks and read markers.
        max_frame = self.state.settings.daemon.ws_max_frame_bytes
        return Inbound(max_frame, max_frame, keep_messages=True)

    async def first_message(self) -> bytes | None:
        """The payload of the first data message (after ``upgrade(identify=True)``);
        None if the connection ends first."""
        assert self.first is not None, "the upgrade said the first message identifies the user"
        try:
            return await self.first
        finally:
            self.first = None

    def on_message(self, message: DataMessage) -> None:
        """A client's whole data message: the ``auth`` frame, where the handshake
        had no token, then acks and read markers (``daemon.client_frames``);
        each is checked (framing, UTF-8) and counted against the frame rate
        first. The conformance testee echoes them instead."""
        if self.first is not None and not self.first.done():
            self.first.set_result(message.data)
            return
        if not hasattr(self, "subscriber"):
            self.close(CloseCode.INVALID_DATA, "client frame before the hello")
            return
        frames = self.client_frames
        if frames is None:
            frames = self.client_frames = self.handler.client_frames(self)
        try:
            frames.take(message.data)
        except BadClientFrame as exc:
            metrics.CLOSES.labels("bad_client_frame").inc()
            self.close(CloseCode.INVALID_DATA, str(exc))

    def _ws_data(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:
            reader = self.reader = self.new_inbound()
        events = reader.feed(data)
        if reader.idle:
            self.reader = None
        for event in events:
            if type(event) is Ending:
                if event.metric is not None:
                    metrics.CLOSES.labels(event.metric).inc()
                self.close(event.code, event.reason)  # a peer's close is answered with its own code
                return
            if type(event) is Control and event.opcode is Opcode.PONG and self.ping_sent:
                self.ping_sent = 0.0  # the answer to our ping
                continue
            # data frames, pings, unasked pongs: nothing is expected, so they are rate-limited
            if not self._within_rate():
                metrics.CLOSES.labels("frame_rate").inc()
                self.close(CloseCode.POLICY, "too many frames")
                return
            if type(event) is Control:
                if event.opcode is Opcode.PING and not self.transport.is_closing():
                    self.flush()  # never ahead of a held 101
                    self.transport.write(pong_frame(event.data))
            elif type(event) is DataMessage and event is not FRAGMENT:
                self.on_message(event)

    def _within_rate(self) -> bool:
        now = time.monotonic()
        if now - self.window_start >= 1.0:
            self.window_start, self.window_count = now, 0
        self.window_count += 1
        return self.window_count <= self.state.settings.daemon.ws_max_frames_per_second

    # --- WebSocket: keep-alive and closing ------------------------------------
    def next_due(self) -> float:
        """When ``heartbeat`` next has something to do: the token's expiry, the
        unanswered ping's deadline, or the next ping. A pong only makes it
        later, so the daemon, which visits the socket then (``daemon.lifecycle``),
        need not hear of it. A ping out past ``next_ping`` (a timeout longer
        than the interval) keeps it due, visited each tick until its pong, as
        every socket used to be."""
        due = min(self.expires, self.next_ping)
        if self.ping_sent:
            return min(due, self.ping_sent + self.state.settings.daemon.ping_timeout_seconds)
        return due

    def heartbeat(self, now: float) -> None:
        """Called by the daemon once ``next_due`` has come (or up to a tick before)."""
        if self.transport.is_closing():
            # Closed under it (the peer reset it, or an abort): its connection_lost, which the
            # transport has scheduled, forgets it. A ping written now would raise (uvloop), and
            # end every socket's heartbeat with it.
            return
        if now >= self.expires:  # the handshake checked the token; the heartbeat holds it to its `exp`
            metrics.CLOSES.labels("token_expired").inc()
            self.close(CloseCode.TOKEN_EXPIRED, "token expired: reconnect with a new token and since")
            return
        settings = self.state.settings
        if self.ping_sent:
            if now - self.ping_sent > settings.daemon.ping_timeout_seconds:
                metrics.CLOSES.labels("ping_timeout").inc()
                self.transport.abort()  # half-open: no close handshake is possible
        elif now >= self.next_ping:
            self.ping_sent, self.next_ping = now, now + settings.daemon.ping_interval_seconds
            self.flush()  # never ahead of a held 101
            self.transport.write(PING)

    def close(self, code: int, reason: str) -> None:
        """Sends a close frame and closes once it is flushed; a peer that
        stops reading is cut off (``_reap_if_stalled``)."""
        if self.closing:
            return
        self.flush()  # what is corked goes out before the close frame
        if self.closing:  # that write overran the send buffer: closed with 4008 already
            return
        self.closing = True
        self._wake_drain_waiter()
        if self.first is not None and not self.first.done():
            self.first.set_result(None)
        self.handler.forget(self)
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(close_frame(code, reason))
        transport.close()
        settings = self.state.settings
        _reap_if_stalled(transport, max(settings.daemon.close_stall_seconds, settings.daemon.ping_timeout_seconds),
                         transport.get_write_buffer_size())


def _reap_if_stalled(transport: asyncio.Transport, period: float, unsent: int) -> None:
    """A closing connection keeps flushing (the client still gets its close
    code) for as long as the client keeps reading; one that stops is aborted."""
    def check() -> None:
        left = transport.get_write_buffer_size()
        if left == 0:  # flushed, and closed
            return
        if left >= unsent:
            transport.abort()
        else:
            _reap_if_stalled(transport, period, left)
    asyncio.get_running_loop().call_later(period, check)
