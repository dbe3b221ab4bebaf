"""A closed WebSocket is freed as it goes, on real sockets: the connection and
the subscriber it holds refer to each other until the daemon forgets it, and a
pair still linked would wait for the collector's full pass (an idle socket that
lived long is in its oldest generation), holding its memory until then."""

import asyncio
import gc

from chat.settings import Settings
from daemon.connection import Connection
from daemon.hub import Hub, Subscriber
from daemon.routes import Router
from daemon.server import Daemon
from tests.timing import eventually


def connections_alive() -> int:
    return sum(type(o) is Connection for o in gc.get_objects())


async def test_a_closed_websocket_is_freed_without_the_cyclic_collector():
    settings = Settings(_env_file=None)
    daemon = Daemon(settings, Hub(settings.daemon.send_buffer_max_bytes), stream=None)
    state, router = daemon.state, Router(daemon)
    server = await asyncio.get_running_loop().create_server(lambda: Connection(state, router), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    gc.collect()
    before = connections_alive()
    gc.disable()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await eventually(lambda: state.http_conns, "the server's side of the connection is made")
        conn = next(iter(state.http_conns))
        conn.upgrade(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")  # what daemon.websocket does, past the checks
        conn.subscriber = Subscriber(conn, "bob")
        daemon.sockets.add(conn)  # joined, as Daemon.join does, without the heartbeat wheel's hold on it
        daemon.hub.register(conn.subscriber)
        assert conn.subscriber.sink is conn and daemon.hub.count == 1
        del conn
        writer.close()
        await eventually(lambda: not state.conns, "the server's side sees the close")
        assert daemon.hub.count == 0 and connections_alive() == before
    finally:
        gc.enable()
        server.close()
        await server.wait_closed()
