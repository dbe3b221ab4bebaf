"""Accepts connections on the daemon's listening socket: all that are waiting,
each time it is readable.

Why not ``loop.create_server``: under uvloop, libuv (since 1.45, "don't
accept() connections in a loop") accepts one connection per loop iteration.
A daemon busy with a thousand keep-alive polls runs iterations of tens of
milliseconds, so a burst of connects waited in the kernel's accept queue for
seconds: ``ab -k -c 1000`` measured a max request time of 4.9 s in 5 s runs
(19.9 s in 20 s runs), every outlier a first request, while the daemon
answered each one within 300 ms of accepting it. asyncio's own loop accepts
in a loop, as this does; the sockets then go to the loop as accepted sockets.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable

from chat.errors import error_body
from daemon.wire import http_response

log = logging.getLogger("chat.daemon")

BATCH = 1024  # accepts per readiness event, so one burst cannot starve the clients already here
RETRY_SECONDS = 1.0  # out of file descriptors: pause accepting, as asyncio does
OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# Said to a connection accepted past the ceiling, then closed: it never costs
# more than the accept. A client that has not sent its request yet reads it
# as the answer to it.
FULL = http_response(503, error_body("try_again_later", "this daemon is full; retry"), headers={"Retry-After": "1"})


def connection_ceiling(max_connections: int) -> int:
    """Open sockets past which a new one is refused at accept: the cap (past
    which requests get 503) plus a sixteenth, 64 at least. At the largest
    cap the settings allow (18,000) it stays under the 20,000 open files a
    process may have, with room for the daemon's own (its Mongo client, logs)."""
    return max_connections + max(64, max_connections // 16)


class Acceptor:
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 protocol_factory: Callable[[], asyncio.Protocol], room: Callable[[int], bool] = lambda n: True):
        """``room(n)``: whether the daemon takes one more connection when ``n``
        are accepted but not yet handed to it."""
        self._loop = loop
        self._sock = sock
        self._factory = protocol_factory
        self._room = room
        self._handing = 0  # accepted, and not yet a protocol the daemon counts
        self._pending: set[asyncio.Task] = set()
        sock.setblocking(False)

    def start(self) -> None:
        if self._sock.fileno() != -1:  # not closed meanwhile (a retry after a pause)
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        """Stops accepting; the connections already accepted stay."""
        if self._sock.fileno() != -1:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()

    def _accept(self) -> None:
        for _ in range(BATCH):
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in OUT_OF_RESOURCES:
                    raise
                log.warning("event=accept_paused error=%s retry_in_s=%g", errno.errorcode[exc.errno], RETRY_SECONDS)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(RETRY_SECONDS, self.start)
                return
            conn.setblocking(False)
            if not self._room(self._handing):
                # Past the ceiling: silent sockets could otherwise take every
                # file descriptor, and the daemon's own (its Mongo client's) with them.
                try:
                    conn.send(FULL)
                except OSError:
                    pass
                conn.close()
                continue
            self._handing += 1
            task = self._loop.create_task(self._connect(conn))
            self._pending.add(task)  # a task nobody holds can be collected mid-way
            task.add_done_callback(self._pending.discard)

    async def _connect(self, conn: socket.socket) -> None:
        made: asyncio.Protocol | None = None

        def factory() -> asyncio.Protocol:
            # The protocol counts itself from here on (``room``): counted here
            # too, it would count twice until the task ends.
            nonlocal made
            self._handing -= 1
            made = self._factory()
            return made

        try:
            await self._loop.connect_accepted_socket(factory, conn)
        except OSError as exc:  # the peer left before the transport was made
            conn.close()
            if made is not None:
                made.connection_lost(exc)  # it counted itself: it must uncount
        finally:
            if made is None:
                self._handing -= 1
