"""Runs an ASGI app (the write API) on a listening socket that several processes share.

Each process binds its own socket with SO_REUSEPORT and the kernel spreads
new connections over them, so `supervisorctl restart` of one process leaves
the others serving.
"""

from __future__ import annotations

import socket

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class KeepAliveHttp10(HttpToolsProtocol):
    """uvicorn closes every HTTP/1.0 connection after one response, even one
    that asked ``Connection: keep-alive``. ``ab -k`` speaks HTTP/1.0, so every
    "keep-alive" request paid a new TCP connection. HTTP/1.0 keep-alive is
    opt-in on both sides: honour the client's request and say so in the
    response, as HTTP/1.0 requires."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if (cycle is not None and cycle.scope is self.scope and self.scope.get("http_version") == "1.0"
                and self.parser.should_keep_alive()):
            cycle.keep_alive = True
            cycle.default_headers = [*cycle.default_headers, (b"connection", b"keep-alive")]


def reuseport_socket(host: str, port: int, backlog: int = 4096) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def serve(app, host: str, port: int, **config) -> None:
    sock = reuseport_socket(host, port)
    # proxy_headers off: nothing here reads the client address (limits are
    # per user), so the middleware would only cost time on every request.
    cfg = uvicorn.Config(app, log_config=None, access_log=False, loop="uvloop", http=KeepAliveHttp10,
                         proxy_headers=False, backlog=4096, **config)
    uvicorn.Server(cfg).run(sockets=[sock])
