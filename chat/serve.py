"""Runs an ASGI app (the write API) on a listening socket that several processes share.

Each process binds its own socket with SO_REUSEPORT and the kernel spreads
new connections over them, so `supervisorctl restart` of one process leaves
the others serving.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn
from starlette.types import ASGIApp
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
HEAD_TOO_LARGE = _error_response(b"431 Request Header Fields Too Large", "headers_too_large",
                                 f"request head over the limit ({HEAD_MAX_BYTES // 1024} KiB)")
HEAD_TIMEOUT = _error_response(b"408 Request Timeout", "request_timeout", "request head not complete in time")


class KeepAliveHttp10(HttpToolsProtocol):
    """uvicorn's httptools protocol, with three changes.

    HTTP/1.0 keep-alive: uvicorn closes every HTTP/1.0 connection after one
    response, even one that asked ``Connection: keep-alive``. ``ab -k`` speaks
    HTTP/1.0, so every "keep-alive" request paid a new TCP connection. HTTP/1.0
    keep-alive is opt-in on both sides: honour the client's request and say so
    in the response, as HTTP/1.0 requires.

    A bounded request head: httptools buffers a header however long it is
    (8 MB accepted, measured), and uvicorn applies its size setting to h11
    only. A head still incomplete past ``HEAD_MAX_BYTES`` gets 431 and the
    connection is closed. The count is taken after each read is parsed, so one
    read (at most 256 KiB) may pass beyond it.

    A head deadline: 408 if a head is not complete ``head_timeout`` seconds
    after it began. A client that trickles one (slowloris) would otherwise
    hold its connection for good: uvicorn's keep-alive timer stops at the
    first byte.
    """

    head_timeout = 10.0  # serve() sets it from the settings
    _in_head = True  # no complete request head since the last one (or the connection's start)
    _ended = False  # a request ended within the read being parsed
    _head_bytes = 0
    _head_timer = None

    def data_received(self, data: bytes) -> None:
        self._ended = False
        super().data_received(data)
        # A head arriving in parts. Not if a request ended within this read:
        # then part of it was that request's body (one read is bounded anyway).
        if self._in_head and not self._ended and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > HEAD_MAX_BYTES:
                self._refuse(HEAD_TOO_LARGE)
            elif self._head_timer is None:  # (a head that comes whole, as most do, costs no timer)
                self._head_timer = self.loop.call_later(self.head_timeout, self._refuse, HEAD_TIMEOUT)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()
        cycle = self.cycle
        if (cycle is not None and cycle.scope is self.scope and self.scope.get("http_version") == "1.0"
                and self.parser.should_keep_alive()):
            cycle.keep_alive = True
            cycle.default_headers = [*cycle.default_headers, (b"connection", b"keep-alive")]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = self._ended = True  # what comes next is the next request's head

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _refuse(self, response: bytes) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
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


def serve(app: ASGIApp, host: str, port: int, head_timeout_seconds: float = 10.0, **config: Any) -> None:
    # Bound now, listening once the app's start-up (its lifespan) is done:
    # uvicorn's create_server listens only after it.
    sock = reuseport_socket(host, port, listen=False)
    http = type("KeepAliveHttp10", (KeepAliveHttp10,), {"head_timeout": head_timeout_seconds})
    # proxy_headers off: nothing here reads the client address (limits are
    # per user), so the middleware would only cost time on every request.
    cfg = uvicorn.Config(app, log_config=None, access_log=False, loop="uvloop", http=http,
                         proxy_headers=False, backlog=LISTEN_BACKLOG, h11_max_incomplete_event_size=HEAD_MAX_BYTES,
                         **config)
    uvicorn.Server(cfg).run(sockets=[sock])
