"""The daemon's drain on SIGTERM, on real sockets: an idle keep-alive HTTP
connection is closed, and a connection the acceptor has counted but whose
transport is not made yet (its protocol exists, ``connection_made`` has not
run) is passed over rather than failing the drain."""

import asyncio

from chat.settings import DaemonSettings, Settings
from daemon.connection import Connection
from daemon.hub import Hub
from daemon.lifecycle import drain
from daemon.routes import Router
from daemon.server import Daemon
from tests.timing import S, eventually

DRAIN_SECONDS = 0.3


async def test_drain_closes_idle_http_and_passes_over_a_connection_not_yet_made():
    settings = Settings(_env_file=None, daemon=DaemonSettings(drain_seconds=DRAIN_SECONDS))
    daemon = Daemon(settings, Hub(settings.daemon.send_buffer_max_bytes), stream=None)
    state, router = daemon.state, Router(daemon)
    server = await asyncio.get_running_loop().create_server(lambda: Connection(state, router), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await eventually(lambda: state.http_conns, "the server's side of the connection is made")
    not_made = Connection(state, router)  # what the acceptor's factory returns, before its transport exists
    assert not_made in state.conns

    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(drain(daemon), timeout=5 * S)
    waited = asyncio.get_running_loop().time() - started

    assert await asyncio.wait_for(reader.read(), timeout=2 * S) == b""  # the idle client: closed, nothing sent
    assert not_made in state.conns  # still counted: the drain waits its full period for it
    assert waited >= DRAIN_SECONDS * 0.9
    writer.close()
    server.close()
    await server.wait_closed()
