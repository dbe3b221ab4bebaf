"""The daemon's layers: a connection knows its server only as a ServerState
and a Handler; the oplog tail and its events sit below both the daemon and
the relay; what flows from a tail to the stream is typed."""

import ast
import asyncio
from pathlib import Path

from chat.settings import Settings
from daemon.connection import Connection, ServerState
from daemon.http_phase import Request
from daemon.hub import Hub
from daemon.stream import Stream
from daemon.tail_reader import FillRequest
from oplog.events import Batch, OplogSource, Restarted
from oplog.tail import OplogTail
from relay.client import RelayTail
from tests.timing import S, eventually

ROOT = Path(__file__).resolve().parents[2]
SERVING = ("daemon.server", "daemon.routes", "daemon.websocket", "daemon.lifecycle")


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, wherever the import stands (under TYPE_CHECKING too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_connection_module_imports_nothing_that_serves_the_daemon():
    imported = imported_modules(ROOT / "daemon" / "connection.py")
    assert not {name for name in imported if name.startswith(SERVING)}


def test_the_oplog_package_imports_neither_the_daemon_nor_the_relay():
    paths = sorted((ROOT / "oplog").glob("*.py"))
    assert {p.name for p in paths} >= {"tail.py", "events.py", "backoff.py"}
    for path in paths:
        imported = imported_modules(path)
        assert not {name for name in imported if name.split(".")[0] in ("daemon", "relay")}, path.name


def test_the_relay_imports_nothing_of_the_daemon():
    for path in sorted((ROOT / "relay").glob("*.py")):
        assert not {name for name in imported_modules(path) if name.split(".")[0] == "daemon"}, path.name


class Greeter:
    """A handler of its own: what a connection needs of a server, and nothing more."""

    def __init__(self):
        self.forgotten: list[Connection] = []

    async def handle_upgrade(self, conn: Connection, request: Request) -> bool:
        conn.respond(404, b'{"error":"not_found"}', False)
        return False

    async def handle_http(self, conn: Connection, request: Request) -> None:
        conn.respond(200, b'{"path":"' + request.target + b'"}', request.keep_alive)

    def forget(self, conn: Connection) -> None:
        self.forgotten.append(conn)


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: bytes) -> bytes:
    writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: chat.example\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5 * S)
    length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
                  .split(b":")[1])
    return head + await asyncio.wait_for(reader.readexactly(length), 5 * S)


async def test_a_connection_serves_http_with_only_a_server_state_and_a_handler():
    state, handler = ServerState(Settings(_env_file=None)), Greeter()
    server = await asyncio.get_running_loop().create_server(lambda: Connection(state, handler), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        first = await _exchange(reader, writer, b"/one")
        assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b'{"path":"/one"}')
        assert b"connection: close" not in first.lower()
        assert len(state.conns) == 1 and state.conns == state.http_conns  # it counts itself in
        state.draining = True  # the server's drain: the next answer ends the connection
        second = await _exchange(reader, writer, b"/two")
        assert second.endswith(b'{"path":"/two"}') and b"connection: close" in second.lower()
        assert await asyncio.wait_for(reader.read(), 5 * S) == b""
        await eventually(lambda: not state.conns, "the connection counts itself out once it is gone")
        assert not state.http_conns and not handler.forgotten  # forget is for WebSockets only
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


def test_every_source_of_oplog_batches_declares_the_same_interface():
    for source in (OplogTail, RelayTail):
        assert all(callable(getattr(source, name)) for name in ("newest_ts", "batches"))
    # A Protocol with data members is checked by hand: what the stream reads of a source.
    assert set(OplogSource.__annotations__) == {"namespace", "last_ts"}
    assert Batch([{"ts": 1}]).entries == [{"ts": 1}] and Restarted() == Restarted()


async def test_fill_requests_in_the_stream_queue_are_typed_and_coalesce():
    class Quiet:
        namespace, last_ts = "layers.messages", None

    stream = Stream(None, Quiet(), Hub(1 << 20), retention_seconds=60, cache_max=10, gap_check_seconds=60)
    stream.inbox.request_fill()
    stream.inbox.request_fill()  # one read of the truth is already asked for
    queued = []
    while not stream.inbox.empty():
        queued.append(stream.inbox.get_nowait())
    assert [type(item) for item, _received in queued] == [FillRequest]
