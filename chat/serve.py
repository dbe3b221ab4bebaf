"""Runs an ASGI app on a listening socket that several processes share.

Each process binds its own socket with SO_REUSEPORT and the kernel spreads
new connections over them, so `supervisorctl restart` of one process leaves
the others serving.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn


def reuseport_socket(host: str, port: int, backlog: int = 4096) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """Tells the app the moment shutdown starts (before connections are closed),
    so that long-polls can answer at once instead of holding the drain up."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None] | None):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        if self._on_exit is not None:
            self._on_exit()
        super().handle_exit(sig, frame)


def serve(app, host: str, port: int, on_exit: Callable[[], None] | None = None, **config) -> None:
    sock = reuseport_socket(host, port)
    cfg = uvicorn.Config(app, log_config=None, access_log=False, loop="uvloop", http="httptools",
                         backlog=4096, **config)
    _Server(cfg, on_exit).run(sockets=[sock])
