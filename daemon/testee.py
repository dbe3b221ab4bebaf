"""A WebSocket echo server on the daemon's own wire, for Autobahn|Testsuite
(docs/conformance.md): ``python -m daemon.testee --port N``.

The suite's fuzzing client tests an echo server, which ``/v1/ws`` is not (it
sends a hello first, needs a token and drops what clients send). This serves
the same acceptor, handshake, connection, inbound frame reader, send buffer
and close handling, with no token and no hello, and echoes every text and
binary message. Its limits are raised to what the suite sends (messages up
to 16 MiB, tens of thousands of frames a second); there is no compression,
as on ``/v1/ws``. ``--port 0`` takes a free port; the first line printed
says which.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvloop

from chat.errors import error_body
from chat.settings import DaemonSettings, Settings
from daemon.acceptor import Acceptor
from daemon.client_frames import ClientFrames
from daemon.connection import Connection, ServerState
from daemon.handshake import accept
from daemon.http_phase import Request
from daemon.inbound import Inbound, DataMessage
from daemon.wire import data_frame

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the suite's largest (cases 9.1.6, 9.2.6)


def testee_settings() -> Settings:
    return Settings(daemon=DaemonSettings(ws_max_frame_bytes=MAX_MESSAGE_BYTES, ws_max_frames_per_second=1e9,
                                          send_buffer_max_bytes=4 * MAX_MESSAGE_BYTES))


class EchoConnection(Connection):
    """A daemon connection whose client's messages come back unchanged."""

    __slots__ = ()

    def new_inbound(self) -> Inbound:
        return Inbound(MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES, keep_messages=True)

    def on_message(self, message: DataMessage) -> None:
        transport = self.transport
        transport.write(data_frame(message.opcode, message.data))
        if transport.get_write_buffer_size() > self.state.settings.daemon.send_buffer_max_bytes:
            self.overflow()  # the same bound, and close, as a daemon's pushes


class Testee:
    """The echo server's handler (a ``daemon.connection.Handler``): every
    handshake is accepted, every plain request answered 426."""

    async def handle_upgrade(self, conn: Connection, request: Request) -> bool:
        path = request.target.decode("latin-1").partition("?")[0]
        response = accept(conn, path, request)
        if response is None:
            return False
        conn.upgrade(response)
        return True

    async def handle_http(self, conn: Connection, request: Request) -> None:
        conn.respond(426, error_body("upgrade_required", "a WebSocket echo server"), request.keep_alive,
                     {"Upgrade": "websocket"})

    def forget(self, conn: Connection) -> None:
        """A WebSocket is gone: nothing to unregister here."""

    def client_frames(self, conn: Connection) -> ClientFrames:
        raise NotImplementedError("the echo server's connections echo every message: they have no client frames")


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    state, testee = ServerState(testee_settings()), Testee()
    sock = socket.create_server((host, port), backlog=128)
    acceptor = Acceptor(loop, sock, lambda: EchoConnection(state, testee))
    acceptor.start()
    print(f"testee listening on ws://{host}:{sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m daemon.testee", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="0: a free port, printed on the first line")
    args = parser.parse_args()
    try:
        uvloop.run(serve(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
