"""The daemon's heartbeat loop (``daemon.lifecycle.heartbeats``), without
sockets and on a clock the test moves: every WebSocket that is due is
visited, HEARTBEAT_SLICE at a time, with the event loop free between slices
(deliveries go first); one closed during the pass is not visited, and one not
due yet is not visited until it is. With real connections on it: a ping each
interval, an abort once a pong is late, 4001 at the token's expiry, and an
idle HTTP connection closed, each at the first tick past its time."""

import asyncio
import math

from prometheus_client import REGISTRY

from chat.errors import CloseCode
from chat.settings import DaemonSettings, Settings
from daemon.connection import Connection
from daemon.hub import Hub, Subscriber
from daemon.lifecycle import HEARTBEAT_SLICE, heartbeats
from daemon.routes import Router
from daemon.server import Daemon
from daemon.wire import PING, close_frame
from tests.core.test_inbound import PONG, frame

SOCKETS = 2 * HEARTBEAT_SLICE + 88  # three slices, the last one short
START = 1000.0


class Ticks:
    """The heartbeat's clock and sleep, moved by the test: the loop sleeps
    until ``tick`` moves the clock by what it asked for, then runs its pass."""

    def __init__(self, now: float = START):
        self.now = now
        self.asked: float | None = None
        self.asleep = asyncio.Event()
        self.wake: asyncio.Future | None = None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.asked, self.wake = seconds, asyncio.get_running_loop().create_future()
        self.asleep.set()
        await self.wake

    async def tick(self) -> None:
        """One tick: the loop's sleep ends, and its pass runs to its next sleep."""
        await self.asleep.wait()
        self.asleep.clear()
        assert self.asked is not None and self.wake is not None
        self.now = round(self.now + self.asked, 6)
        self.wake.set_result(None)
        await self.asleep.wait()

    async def until(self, when: float) -> None:
        while self.now < when:
            await self.tick()


def closes(reason: str) -> float:
    return REGISTRY.get_sample_value("chat_daemon_closes_total", {"reason": reason}) or 0.0


class Beat:
    """Stands in for a Connection: what the loop calls, and when."""

    def __init__(self, name: int, log: list, deliveries: list, due: float = 0.0):
        self.name, self.log, self.deliveries, self.due = name, log, deliveries, due

    def heartbeat(self, now: float) -> None:
        self.log.append((self.name, len(self.deliveries)))

    def next_due(self) -> float:
        return self.due  # 0: due every tick


async def test_heartbeats_visit_every_socket_in_slices_and_let_deliveries_run():
    # a tick of 0.1 s
    settings = Settings(_env_file=None, daemon=DaemonSettings(ping_interval_seconds=0.4, ping_timeout_seconds=0.4))
    daemon = Daemon(settings, Hub(settings.daemon.send_buffer_max_bytes), stream=None)
    log: list[tuple[int, int]] = []
    deliveries: list[int] = []
    beats = [Beat(i, log, deliveries) for i in range(SOCKETS)]
    for beat in beats:
        daemon.join(beat)  # type: ignore[arg-type]
    closing = beats[-1]  # the last of the pass (all due at once, they come out in the order they joined)

    async def deliver():  # what else the loop runs: one step per loop iteration
        while True:
            deliveries.append(1)
            if len(log) == HEARTBEAT_SLICE:
                daemon.sockets.discard(closing)  # closed while the first slice was visited
            await asyncio.sleep(0)  # a yield: one step per loop iteration, not a wait

    ticks = Ticks()
    other = asyncio.create_task(deliver())
    beating = asyncio.create_task(heartbeats(daemon, ticks.clock, ticks.sleep))
    await ticks.tick()  # one whole pass
    beating.cancel()
    other.cancel()
    await asyncio.gather(beating, other, return_exceptions=True)

    assert sorted(name for name, _ in log) == sorted(b.name for b in beats if b is not closing)
    seen = [deliveries_then for _, deliveries_then in log]
    slices = [seen[i:i + HEARTBEAT_SLICE] for i in range(0, len(seen), HEARTBEAT_SLICE)]
    assert [len(s) for s in slices] == [HEARTBEAT_SLICE, HEARTBEAT_SLICE, SOCKETS - 1 - 2 * HEARTBEAT_SLICE]
    assert all(len(set(s)) == 1 for s in slices)  # no delivery inside a slice...
    assert slices[0][0] < slices[1][0] < slices[2][0]  # ...and some between slices


class Pinged:
    """Stands in for a Connection with something due at ``due``: once acted on, due 10 s later."""

    def __init__(self, due: float):
        self.due, self.visits = due, []

    def heartbeat(self, now: float) -> None:
        self.visits.append(now)
        if now >= self.due:
            self.due = now + 10

    def next_due(self) -> float:
        return self.due


async def test_a_socket_is_visited_when_it_is_due_not_every_tick():
    # a tick of 0.1 s
    settings = Settings(_env_file=None, daemon=DaemonSettings(ping_interval_seconds=0.4, ping_timeout_seconds=0.4))
    daemon = Daemon(settings, Hub(settings.daemon.send_buffer_max_bytes), stream=None)
    soon, later, closed = Pinged(START + 0.25), Pinged(START + 0.65), Pinged(START + 0.25)
    for conn in (soon, later, closed):
        daemon.join(conn)  # type: ignore[arg-type]
    daemon.sockets.discard(closed)  # closed before it was due: dropped, never visited
    ticks = Ticks()
    beating = asyncio.create_task(heartbeats(daemon, ticks.clock, ticks.sleep))
    await ticks.until(START + 1.0)
    beating.cancel()
    await asyncio.gather(beating, return_exceptions=True)
    assert ticks.asked == daemon.heartbeat_tick == 0.1
    assert closed.visits == []
    assert soon.visits == [START + 0.3] and later.visits == [START + 0.7]  # the first tick at or past each due time
    assert len(daemon.due) == 2  # both scheduled again (10 s on), the closed one gone


# --- real connections, on a transport that records what is written, and when --

class Transport:
    def __init__(self, ticks: Ticks, conn: Connection):
        self.ticks, self.conn, self.log, self.closed = ticks, conn, [], False

    def write(self, data: bytes) -> None:
        self.log.append((self.ticks.now, "ping" if data == PING else data))

    def abort(self) -> None:
        self.log.append((self.ticks.now, "abort"))
        self.closed = True
        asyncio.get_running_loop().call_soon(self.conn.connection_lost, None)  # as asyncio's transports do

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


def serving(**daemon_settings) -> tuple[Daemon, Ticks, asyncio.Task]:
    daemon = Daemon(Settings(_env_file=None, daemon=DaemonSettings(**daemon_settings)), Hub(256 * 1024), stream=None)
    ticks = Ticks()
    return daemon, ticks, asyncio.create_task(heartbeats(daemon, ticks.clock, ticks.sleep))


def websocket(daemon: Daemon, ticks: Ticks, expires: float = math.inf) -> tuple[Connection, Transport]:
    """A connection as ``daemon.websocket`` leaves it after the upgrade, at the clock's time."""
    conn = Connection(daemon.state, Router(daemon))
    transport = Transport(ticks, conn)
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.http = None
    daemon.state.http_conns.discard(conn)
    conn.subscriber = Subscriber(conn, "bob")
    conn.next_ping, conn.expires = ticks.now + daemon.settings.daemon.ping_interval_seconds, expires
    daemon.join(conn)
    return conn, transport


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_websocket_is_pinged_each_interval_and_aborted_once_a_pong_is_late():
    daemon, ticks, beating = serving(ping_interval_seconds=20, ping_timeout_seconds=5)  # a tick of 1 s
    aborted = closes("ping_timeout")
    conn, transport = websocket(daemon, ticks)
    await ticks.until(START + 19)
    assert transport.log == []  # nothing before the interval
    await ticks.tick()
    assert transport.log == [(START + 20, "ping")]
    await ticks.until(START + 24)
    conn.data_received(frame(PONG))  # answered within the timeout: kept
    await ticks.until(START + 39)
    assert transport.log == [(START + 20, "ping")] and conn in daemon.sockets
    await ticks.tick()
    assert transport.log[-1] == (START + 40, "ping")  # the next interval's; this one is never answered
    await ticks.until(START + 45)
    assert conn in daemon.sockets  # 5 s late is within the timeout...
    await ticks.tick()
    assert transport.log[1:] == [(START + 40, "ping"), (START + 46, "abort")]  # ...past it, dropped (half-open)
    await ticks.tick()
    assert conn not in daemon.sockets and conn not in daemon.state.conns
    assert closes("ping_timeout") == aborted + 1
    await stop(beating)


async def test_a_websocket_is_closed_with_4001_at_the_first_tick_past_its_token_expiry():
    daemon, ticks, beating = serving(ping_interval_seconds=4, ping_timeout_seconds=4)  # a tick of 1 s
    expired = closes("token_expired")
    conn, transport = websocket(daemon, ticks, expires=START + 7.5)
    await ticks.until(START + 7)
    assert transport.log == [(START + 4, "ping")] and not transport.closed  # alive until exp
    conn.data_received(frame(PONG))
    await ticks.tick()
    reason = "token expired: reconnect with a new token and since"
    assert transport.log == [(START + 4, "ping"), (START + 8, close_frame(CloseCode.TOKEN_EXPIRED, reason))]
    assert transport.closed and conn not in daemon.sockets and len(daemon.due) == 0
    assert closes("token_expired") == expired + 1
    await ticks.until(START + 20)
    assert len(transport.log) == 2  # nothing after the close frame
    await stop(beating)


class HttpTransport(Transport):
    def __init__(self, ticks: Ticks, conn: Connection, unsent: int = 0):
        super().__init__(ticks, conn)
        self.unsent = unsent

    def close(self) -> None:
        self.log.append((self.ticks.now, "close"))
        super().close()

    def get_write_buffer_size(self) -> int:
        return self.unsent


async def test_an_http_connection_idle_past_its_limit_is_closed_and_one_with_a_request_in_hand_is_not():
    daemon, ticks, beating = serving(http_idle_seconds=2.5)  # a tick of 1 s
    idle, unread, busy = (Connection(daemon.state, Router(daemon)) for _ in range(3))
    transports = {}
    for conn, unsent in ((idle, 0), (unread, 100), (busy, 0)):
        transports[conn] = HttpTransport(ticks, conn, unsent)
        conn.connection_made(transports[conn])  # type: ignore[arg-type]
        assert conn.http is not None
        conn.http.idle_since = ticks.now  # connected now, no request yet
    assert busy.http is not None
    busy.http.task = asyncio.get_running_loop().create_future()  # type: ignore[assignment]  # a request in hand
    await ticks.until(START + 2)
    assert all(t.log == [] for t in transports.values())
    await ticks.tick()
    assert transports[idle].log == [(START + 3, "close")]  # no request for 2.5 s: closed
    assert transports[unread].log == [(START + 3, "abort")]  # and one that left its answer unread: cut off
    assert transports[busy].log == [] and daemon.state.http_conns == {busy}
    busy.http.task.cancel()  # type: ignore[union-attr]
    await stop(beating)


class ResetTransport(Transport):
    """As uvloop's after the peer reset the connection: closed at once, its connection_lost still
    to come, and any write raises."""

    def write(self, data: bytes) -> None:
        if self.closed:
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")
        super().write(data)


async def test_a_socket_the_peer_reset_before_its_ping_ends_no_heartbeat_and_takes_no_frame():
    daemon, ticks, beating = serving(ping_interval_seconds=20, ping_timeout_seconds=5)
    conn = Connection(daemon.state, Router(daemon))
    transport = ResetTransport(ticks, conn)
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.http = None
    daemon.state.http_conns.discard(conn)
    conn.subscriber = Subscriber(conn, "bob")
    conn.next_ping, conn.expires = ticks.now + 20, math.inf
    daemon.join(conn)
    other, other_transport = websocket(daemon, ticks)
    await ticks.until(START + 19)
    transport.closed = True  # reset by the peer; connection_lost is still to come
    conn.send(1, b'{"id": "1"}', None)  # a message for it meanwhile: not written, not raised
    conn.signal(b'{"type": "typing"}')
    conn.send_text(b'{"type": "hello"}')
    await ticks.tick()  # its ping is due now
    assert not beating.done(), "the heartbeat loop lives on"
    assert transport.log == [] and other_transport.log == [(START + 20, "ping")]
    conn.connection_lost(None)
    assert conn not in daemon.sockets and other in daemon.sockets
    await stop(beating)
