"""A connection given several messages before the loop's next turn writes them
in one ``write()``: each its own WebSocket text frame, in order. Its close,
its hello and a paged catch-up's wait see the corked frames out first (the
hello in the same write, with the 101 held for it), and a
socket whose client does not read is still closed with 4008 after a gap-free
prefix."""

import asyncio
import types

import pytest

from chat.errors import CloseCode
from chat.settings import DaemonSettings, Settings
from daemon import connection
from daemon.connection import Connection, ServerState
from daemon.hub import Hub, Subscriber
from daemon.wire import PING, FrameReader, Opcode, close_frame, text_frame
from websockets.frames import Close
from tests.timing import PATIENCE


class Recording:
    """A transport that keeps each ``write()`` and reports the unsent bytes it is told to."""

    def __init__(self, unsent: int = 0, inner: asyncio.Transport | None = None, fails: bool = False):
        self.writes: list[bytes] = []
        self.unsent, self.inner, self.closed, self.fails, self.aborted = unsent, inner, False, fails, False

    def write(self, data: bytes) -> None:
        if self.fails:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")
        self.writes.append(bytes(data))
        if self.inner is not None:
            self.inner.write(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True
        if self.inner is not None:
            self.inner.close()

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_write_buffer_size(self) -> int:
        return self.unsent


class Forgets:
    """The handler of a connection that is live from the start: it forgets it from the hub on close."""

    def __init__(self, hub: Hub):
        self.hub = hub

    def forget(self, conn: Connection) -> None:
        self.hub.unregister(conn.subscriber)


def settings(send_buffer_max_bytes: int = 1 << 20) -> Settings:
    return Settings(_env_file=None, daemon=DaemonSettings(send_buffer_max_bytes=send_buffer_max_bytes,
                                                          close_stall_seconds=60))


def live(state: ServerState, hub: Hub, user: str, transport: Recording) -> Connection:
    conn = Connection(state, Forgets(hub))  # type: ignore[arg-type]
    conn.transport, conn.http = transport, None  # type: ignore[assignment]
    conn.subscriber = Subscriber(conn, user)
    conn.subscriber.pending = None
    hub.register(conn.subscriber)
    return conn


async def next_turn() -> None:
    """Returns once the loop has run every callback scheduled before the call (call_soon is FIFO)."""
    turned = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(turned.set_result, None)
    await turned


def dispatch(hub: Hub, msg_id: int, sender: str, recipient: str) -> bytes:
    payload = b'{"id":"%d"}' % msg_id
    hub.dispatch(msg_id, sender, recipient, payload, text_frame)
    return payload


def payloads(data: bytes) -> list[bytes]:
    frames = FrameReader(None, mask=False).feed(data)
    assert all(f.opcode is Opcode.TEXT and f.fin for f in frames)
    return [f.data for f in frames]


async def test_a_socket_given_a_batch_gets_one_write_of_separate_frames_in_order_on_the_wire():
    state, hub = ServerState(settings()), Hub(1 << 20)
    server_side: asyncio.Future[asyncio.Transport] = asyncio.get_running_loop().create_future()

    class Accepting(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            server_side.set_result(transport)  # type: ignore[arg-type]

    server = await asyncio.get_running_loop().create_server(Accepting, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        bob = Recording(inner=await asyncio.wait_for(server_side, PATIENCE))
        carol = Recording()
        live(state, hub, "bob", bob), live(state, hub, "carol", carol)
        # One stream batch: to bob, from bob (his other devices get it), and one for carol between.
        sent = [dispatch(hub, 1, "alice", "bob"), dispatch(hub, 2, "bob", "carol"), dispatch(hub, 3, "x", "carol"),
                dispatch(hub, 4, "alice", "bob")]
        assert bob.writes == [] and carol.writes == [], "nothing is written before the loop's next turn"
        await next_turn()
        assert len(bob.writes) == 1 and len(carol.writes) == 1
        assert payloads(carol.writes[0]) == [sent[1], sent[2]]
        want = b"".join(text_frame(p) for p in (sent[0], sent[1], sent[3]))
        got = b""
        while len(got) < len(want):
            got += await asyncio.wait_for(reader.read(1 << 16), PATIENCE)
        assert got == want and payloads(got) == [sent[0], sent[1], sent[3]]
        writer.close()
    finally:
        server.close()


async def test_a_slow_socket_is_closed_with_4008_after_the_frames_it_was_written():
    state, hub = ServerState(settings(send_buffer_max_bytes=4096)), Hub(4096)
    slow, other = Recording(unsent=4097), Recording()
    live(state, hub, "slow", slow), live(state, hub, "other", other)
    first = [dispatch(hub, 1, "a", "slow"), dispatch(hub, 2, "a", "slow")]
    dispatch(hub, 3, "a", "other")
    await next_turn()
    # The write that left more than the bound unsent is followed by the close: a gap-free prefix.
    assert payloads(slow.writes[0]) == first
    assert slow.writes[1:] == [close_frame(CloseCode.SLOW_CONSUMER, "slow consumer: reconnect with since")]
    assert slow.closed and hub.connections_of("slow") == 0
    dispatch(hub, 4, "a", "slow")
    await next_turn()
    assert len(slow.writes) == 2, "nothing after the close frame"
    assert [payloads(w) for w in other.writes] == [[b'{"id":"3"}']]


async def test_a_close_writes_the_corked_frames_first():
    state, hub = ServerState(settings()), Hub(1 << 20)
    bob = Recording()
    conn = live(state, hub, "bob", bob)
    sent = [dispatch(hub, 1, "a", "bob"), dispatch(hub, 2, "a", "bob")]
    conn.close(CloseCode.RESTART, "restarting")
    assert payloads(bob.writes[0]) == sent
    assert Close.parse(FrameReader(None, mask=False).feed(bob.writes[1])[0].data).code == CloseCode.RESTART
    await next_turn()
    assert len(bob.writes) == 2, "the flush at the loop's turn finds nothing more"


async def test_a_text_frame_and_a_paged_catch_up_wait_see_the_corked_frames_out_first():
    state, hub = ServerState(settings()), Hub(1 << 20)
    bob = Recording()
    conn = live(state, hub, "bob", bob)
    sent = dispatch(hub, 1, "a", "bob")
    conn.send_text(b'{"type":"error"}')
    assert [payloads(w) for w in bob.writes] == [[sent, b'{"type":"error"}']]  # after them, in the same write
    conn.subscriber.send_page([(2, b'{"id":"2"}', None), (3, b'{"id":"3"}', None)])
    assert await conn.drained()  # the catch-up is paced by what the socket holds: its page is written now
    assert payloads(bob.writes[1]) == [b'{"id":"2"}', b'{"id":"3"}']
    await next_turn()
    assert len(bob.writes) == 2, "the flush at the loop's turn finds nothing more"


SWITCHING = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"


class Upgrading(Recording):
    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Keeps:
    def forget(self, conn: Connection) -> None:
        pass


def upgraded_with_hello(state: ServerState, transport: Upgrading) -> Connection:
    """A connection in its HTTP phase, upgraded with its 101 held for the hello."""
    conn = Connection(state, Keeps())  # type: ignore[arg-type]
    conn.transport = transport  # type: ignore[assignment]
    conn.http = types.SimpleNamespace(rest=b"")  # type: ignore[assignment]
    conn.upgrade(SWITCHING, with_hello=True)
    conn.subscriber = Subscriber(conn, "bob")
    return conn


async def test_a_101_held_for_the_hello_goes_out_with_it_in_one_write():
    bob = Upgrading()
    conn = upgraded_with_hello(ServerState(settings()), bob)
    assert bob.writes == []
    conn.send_text(b'{"type":"hello"}')
    assert len(bob.writes) == 1 and bob.writes[0].startswith(SWITCHING)
    assert payloads(bob.writes[0][len(SWITCHING):]) == [b'{"type":"hello"}']
    await next_turn()
    assert len(bob.writes) == 1


async def test_a_close_or_a_ping_before_the_hello_writes_the_held_101_first():
    closed = Upgrading()
    conn = upgraded_with_hello(ServerState(settings()), closed)
    conn.close(CloseCode.TRY_AGAIN, "behind")
    assert closed.writes[0] == SWITCHING
    assert Close.parse(FrameReader(None, mask=False).feed(closed.writes[1])[0].data).code == CloseCode.TRY_AGAIN
    pinged = Upgrading()
    conn = upgraded_with_hello(ServerState(settings()), pinged)
    conn.expires = float("inf")
    conn.heartbeat(conn.next_ping)
    assert pinged.writes == [SWITCHING, PING]


async def test_past_cork_max_connections_the_frames_go_out_without_waiting_for_the_loop(
        monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(connection, "CORK_MAX", 3)
    state, hub = ServerState(settings()), Hub(1 << 20)
    sockets = [Recording() for _ in range(4)]
    for i, transport in enumerate(sockets):
        live(state, hub, f"u{i}", transport)
    for i in range(4):
        dispatch(hub, i + 1, "a", f"u{i}")
    assert [len(s.writes) for s in sockets] == [1, 1, 1, 0]
    await next_turn()
    assert [len(s.writes) for s in sockets] == [1, 1, 1, 1]


async def test_a_socket_the_peer_closed_meanwhile_is_not_written():
    state, hub = ServerState(settings()), Hub(1 << 20)
    gone = Recording()
    live(state, hub, "bob", gone)
    dispatch(hub, 1, "a", "bob")
    gone.closed = True  # the peer reset it: uvloop raises on a write now, and connection_lost is to come
    await next_turn()
    assert gone.writes == []


async def test_a_write_that_raises_at_the_turn_cuts_that_socket_off_and_the_others_get_theirs():
    state, hub = ServerState(settings()), Hub(1 << 20)
    broken, after = Recording(fails=True), Recording()
    live(state, hub, "broken", broken), live(state, hub, "after", after)
    dispatch(hub, 1, "a", "broken")
    dispatch(hub, 2, "a", "after")
    await next_turn()
    assert broken.aborted, "cut off: its client resumes with since"
    assert [payloads(w) for w in after.writes] == [[b'{"id":"2"}']]
