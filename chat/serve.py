"""Runs an ASGI app (the write API) on a listening socket that several processes share.

Each process binds its own socket with SO_REUSEPORT and the kernel spreads
new connections over them, so `supervisorctl restart` of one process leaves
the others serving.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httptools
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from chat.errors import error_body


def _error_response(status: bytes, code: str, message: str) -> bytes:
    """A whole answer in the API's error shape, for the protocol to write
    before it closes (no ASGI app is involved yet)."""
    body = error_body(code, message)
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, len(body), body))


# The longest request head a process takes, whatever serve()'s caller passes:
# KeepAliveHttp10 applies it, and uvicorn's h11 setting is given the same.
HEAD_MAX_BYTES = 16 * 1024
HEAD_END = b"\r\n\r\n"  # the blank line that ends a head (httptools takes no bare LF)
HEAD_TOO_LARGE = _error_response(b"431 Request Header Fields Too Large", "headers_too_large",
                                 f"request head over the limit ({HEAD_MAX_BYTES // 1024} KiB)")
HEAD_TIMEOUT = _error_response(b"408 Request Timeout", "request_timeout", "request head not complete in time")
# What the probes ask: they must see a busy process alive, and it answers them cheaply.
HEALTH_PATHS = frozenset({b"/healthz", b"/readyz", b"/metrics"})
OVERLOADED = error_body("overloaded", "this process is at its connection limit; retry")
OVERLOADED_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(OVERLOADED)),
                      (b"retry-after", b"1"), (b"connection", b"close")]


async def overloaded(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer past the connection limit, in the API's error shape (uvicorn's own is text/plain)."""
    await send({"type": "http.response.start", "status": 503, "headers": OVERLOADED_HEADERS})
    await send({"type": "http.response.body", "body": OVERLOADED})


class KeepAliveHttp10(HttpToolsProtocol):
    """uvicorn's httptools protocol, with five changes.

    HTTP/1.0 keep-alive: uvicorn closes every HTTP/1.0 connection after one
    response, even one that asked ``Connection: keep-alive``. ``ab -k`` speaks
    HTTP/1.0, so every "keep-alive" request paid a new TCP connection. HTTP/1.0
    keep-alive is opt-in on both sides: honour the client's request and say so
    in the response, as HTTP/1.0 requires.

    A bounded request head: httptools buffers a header however long it is
    (8 MB accepted, measured), and uvicorn applies its size setting to h11
    only. A head over ``HEAD_MAX_BYTES`` gets 431 and the connection is
    closed, before the parser sees the bytes past the limit, whether the head
    came in one read or many. Each read is fed to the parser a part at a time:
    a head up to its blank line, then a body of known length, so that a head
    that follows another request in the same read is measured from its first
    byte. (Past a chunked body, whose end only the parser finds, the next
    head is measured from the next read on.)

    A head deadline: 408 if a head is not complete ``head_timeout`` seconds
    after it began. A client that trickles one (slowloris) would otherwise
    hold its connection for good: uvicorn's keep-alive timer stops at the
    first byte.

    An idle deadline: a connection that sends no byte in ``idle_timeout``
    seconds is closed, with nothing said. uvicorn arms no timer before a
    first response, and its connection limit counts idle sockets, so silent
    ones could hold a process at its limit for good.

    Past the connection limit (uvicorn's ``limit_concurrency``, the same test
    uvicorn makes), a 503 in the API's error shape with ``Retry-After``
    instead of uvicorn's text/plain, and the health checks (``HEALTH_PATHS``)
    are still served.
    """

    head_timeout = 10.0  # serve() sets both from the settings
    idle_timeout = 30.0
    _in_head = True  # no complete request head since the last one (or the connection's start)
    _head_bytes = 0  # of the head in progress, as far as it has been read
    _head_tail = b""  # its last bytes: where a blank line split over two reads begins
    _body_left: int | None = 0  # body bytes of the request in progress not read yet; None: not known
    _head_timer: asyncio.TimerHandle | None = None
    _idle_timer: asyncio.TimerHandle | None = None
    _refusal: bytes | None = None  # a 431 or 408 held back until the answers owed before it are out

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._idle_timer = self.loop.call_later(self.idle_timeout, self._close_idle)

    def data_received(self, data: bytes) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._refusal is not None:  # nothing after a refused head is read
            return
        pos, size = 0, len(data)
        while pos < size:
            if self._in_head:
                end = self._head_end(data, pos)
                self._head_bytes += end - pos  # (on_headers_complete starts the count anew)
                if self._head_bytes > HEAD_MAX_BYTES:
                    self._refuse(HEAD_TOO_LARGE)
                    return
            elif self._body_left is None:  # only the parser knows where this body ends
                end = size
            else:
                end = min(size, pos + self._body_left)
                self._body_left -= end - pos
            if end == pos:  # (never, by the above; a guard against spinning)
                end = size
            super().data_received(data if end - pos == size else data[pos:end])
            if (self.transport.is_closing() or self.parser is None or self.parser.should_upgrade()
                    or self._refusal is not None):
                return  # refused, gone, or upgraded: uvicorn reads no further either
            pos = end
        if self._in_head and self._head_bytes:
            self._head_tail = (self._head_tail + data)[-(len(HEAD_END) - 1):]
            if self._head_timer is None:  # (a head that comes whole, as most do, costs no timer)
                self._head_timer = self.loop.call_later(self.head_timeout, self._refuse, HEAD_TIMEOUT)

    def _head_end(self, data: bytes, pos: int) -> int:
        """Where the head in progress ends in ``data`` (past its blank line), or
        ``len(data)`` if not within it. A blank line split between the previous
        read and this one is found too: the previous read ended in a head."""
        if pos == 0 and self._head_tail:
            at = (self._head_tail + data[:len(HEAD_END) - 1]).find(HEAD_END)
            if at >= 0:
                return at + len(HEAD_END) - len(self._head_tail)
        at = data.find(HEAD_END, pos)
        return len(data) if at < 0 else at + len(HEAD_END)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes, self._head_tail = False, 0, b""
        self._body_left = self._body_length()
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        limit, refused = self.limit_concurrency, False
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            # uvicorn would answer its own 503 here: it is answered ours, or
            # served if a probe, and uvicorn is told of no limit for this call.
            app, refused = self.app, not self._health_check()
            if refused:
                self.logger.warning("event=over_connection_limit connections=%d requests=%d limit=%d",
                                    len(self.connections), len(self.tasks), limit)
                self.app = overloaded
            self.limit_concurrency = None
            try:
                super().on_headers_complete()
            finally:
                self.app, self.limit_concurrency = app, limit
        else:
            super().on_headers_complete()
        cycle = self.cycle
        if (not refused and cycle is not None and cycle.scope is self.scope
                and self.scope.get("http_version") == "1.0" and self.parser.should_keep_alive()):
            cycle.keep_alive = True
            cycle.default_headers = [*cycle.default_headers, (b"connection", b"keep-alive")]

    def _body_length(self) -> int | None:
        """The body's length as the head declares it; None if the parser alone
        can tell (chunked). A request with neither header has none."""
        length = 0
        for name, value in self.headers:
            if name == b"transfer-encoding":
                return None
            if name == b"content-length":
                value = value.strip()
                if not value.isdigit():
                    return None
                length = int(value)
        return length

    def _health_check(self) -> bool:
        try:
            path = httptools.parse_url(self.url).path
        except httptools.HttpParserInvalidURLError:
            return False
        return path in HEALTH_PATHS

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # what comes next is the next request's head

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def _close_idle(self) -> None:
        self._idle_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refusal is not None and not self._answering() and not self.transport.is_closing():
            self.transport.write(self._refusal)
            self.transport.close()

    def _answering(self) -> bool:
        """Whether an earlier request of this connection still awaits its answer."""
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def _refuse(self, response: bytes) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing() or self._refusal is not None:
            return
        if self._answering():  # answers go out in order: this one after those (on_response_complete)
            self._refusal = response
            self.flow.pause_reading()
            return
        self.transport.write(response)
        self.transport.close()


LISTEN_BACKLOG = 4096


def reuseport_socket(host: str, port: int, backlog: int = LISTEN_BACKLOG, listen: bool = True) -> socket.socket:
    """A socket bound to the port the processes share. With ``listen=False`` it
    is only bound: the kernel hands a socket of an SO_REUSEPORT group
    connections only once it listens, so a process listens when it is ready to
    serve, and one that fails to start never takes connections down with it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def serve(app: ASGIApp, host: str, port: int, head_timeout_seconds: float = 10.0, idle_seconds: float = 30.0,
          **config: Any) -> None:
    # Bound now, listening once the app's start-up (its lifespan) is done:
    # uvicorn's create_server listens only after it.
    sock = reuseport_socket(host, port, listen=False)
    http = type("KeepAliveHttp10", (KeepAliveHttp10,),
                {"head_timeout": head_timeout_seconds, "idle_timeout": idle_seconds})
    # proxy_headers off: nothing here reads the client address (limits are
    # per user), so the middleware would only cost time on every request.
    cfg = uvicorn.Config(app, log_config=None, access_log=False, loop="uvloop", http=http,
                         proxy_headers=False, backlog=LISTEN_BACKLOG, h11_max_incomplete_event_size=HEAD_MAX_BYTES,
                         **config)
    uvicorn.Server(cfg).run(sockets=[sock])
