"""Runs an ASGI app (the write API) on a listening socket that several processes share.

Each process binds its own socket with SO_REUSEPORT and the kernel spreads
new connections over them, so `supervisorctl restart` of one process leaves
the others serving.
"""

from __future__ import annotations

import socket
import uvicorn


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
    cfg = uvicorn.Config(app, log_config=None, access_log=False, loop="uvloop", http="httptools",
                         backlog=4096, **config)
    uvicorn.Server(cfg).run(sockets=[sock])
