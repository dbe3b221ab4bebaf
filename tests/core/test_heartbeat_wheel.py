"""The heartbeat's due-time buckets (daemon/heartbeat_wheel.py) and a
WebSocket's next due time (``Connection.next_due``), with no sockets and no
clock: a connection visited only when due does, tick for tick, what one
visited every tick did."""

import math

import pytest

from chat.errors import CloseCode
from chat.settings import DaemonSettings, Settings
from daemon.connection import Connection, ServerState
from daemon.heartbeat_wheel import DueWheel
from daemon.server import BUCKETS_PER_TICK, heartbeat_tick
from daemon.wire import PING, close_frame


def test_items_due_come_out_and_later_ones_stay():
    wheel: DueWheel[str] = DueWheel(1.0)
    wheel.schedule("late", 105.5)
    wheel.schedule("now", 100.0)
    wheel.schedule("past", 12.0)
    assert sorted(wheel.pop_due(100.2)) == ["now", "past"]
    assert len(wheel) == 1
    assert wheel.pop_due(104.9) == []
    assert wheel.pop_due(105.0) == ["late"]  # its bucket is now's: up to a resolution early
    assert len(wheel) == 0 and wheel.pop_due(1e9) == []


def test_an_item_comes_out_once_and_in_due_order_by_bucket():
    wheel: DueWheel[int] = DueWheel(0.25)
    for i, due in enumerate([3.9, 1.0, 2.6, 1.1, 1.0]):
        wheel.schedule(i, due)
    assert wheel.pop_due(5.0) == [1, 3, 4, 2, 0]  # buckets 4 (1.0, 1.1, 1.0), 10, 15; scheduling order within one
    assert wheel.pop_due(5.0) == []


def test_an_item_scheduled_again_later_is_not_returned_early():
    wheel: DueWheel[str] = DueWheel(0.5)
    wheel.schedule("conn", 10.0)
    assert wheel.pop_due(10.1) == ["conn"]
    wheel.schedule("conn", 30.0)  # the visit found its pong: next due at its next ping
    for now in (10.2, 15.0, 29.49):
        assert wheel.pop_due(now) == []
    assert wheel.pop_due(30.0) == ["conn"]


def test_a_past_due_time_comes_out_at_the_next_pop():
    wheel: DueWheel[str] = DueWheel(1.0)
    wheel.schedule("a", 50.0)
    assert wheel.pop_due(50.0) == ["a"]
    wheel.schedule("a", 49.0)  # scheduled behind what was popped already
    assert wheel.pop_due(50.0) == ["a"]


def test_bucket_edges_and_an_empty_wheel():
    wheel: DueWheel[str] = DueWheel(0.1)
    assert wheel.pop_due(0.0) == [] and wheel.pop_due(-5.0) == [] and len(wheel) == 0
    wheel.schedule("edge", 2.0)
    wheel.schedule("next", 2.1000001)
    assert wheel.pop_due(1.9999999) == []
    assert wheel.pop_due(2.05) == ["edge"]
    assert wheel.pop_due(2.1000001) == ["next"]
    wheel.schedule("negative", -0.05)
    assert wheel.pop_due(-0.11) == [] and wheel.pop_due(-0.1) == ["negative"]  # floor, not truncation
    with pytest.raises(ValueError):
        DueWheel(0.0)


# --- Connection.next_due, and the heartbeat visited only when due ------------

class Transport:
    """Stands in for the socket: what the heartbeat writes, and when."""

    def __init__(self, log: list, clock: list, lost):
        self.log, self.clock, self.lost, self.closed = log, clock, lost, False

    def write(self, data: bytes) -> None:
        self.log.append((self.clock[0], "ping" if data == PING else data))

    def abort(self) -> None:
        self.log.append((self.clock[0], "abort"))
        self.lost()  # connection_lost, which forgets it

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


class Sockets(set):
    """Stands in for the daemon: its WebSockets, and the handler's ``forget``."""

    def forget(self, conn) -> None:
        self.discard(conn)


def websocket(settings: Settings, sockets: Sockets, clock: list, expires: float) -> Connection:
    conn = Connection(ServerState(settings), sockets)
    conn.transport = Transport([], clock, lambda: sockets.forget(conn))  # type: ignore[assignment]
    conn.next_ping, conn.expires = clock[0] + settings.daemon.ping_interval_seconds, expires  # as at the upgrade
    sockets.add(conn)
    return conn


def test_next_due_is_the_token_expiry_the_next_ping_or_the_pong_deadline():
    settings = Settings(_env_file=None, daemon=DaemonSettings(ping_interval_seconds=20, ping_timeout_seconds=5))
    conn = Connection(ServerState(settings), Sockets())
    assert conn.next_due() == 0.0  # before the upgrade: nothing set yet
    conn.next_ping, conn.expires = 120.0, math.inf
    assert conn.next_due() == 120.0
    conn.expires = 110.0
    assert conn.next_due() == 110.0
    conn.expires, conn.ping_sent, conn.next_ping = math.inf, 120.0, 140.0  # a ping out
    assert conn.next_due() == 125.0
    conn.ping_sent = 0.0  # its pong: no wheel operation, the visit at 125 finds the next ping at 140
    assert conn.next_due() == 140.0


@pytest.mark.parametrize(("interval", "timeout"), [(20, 20), (20, 5), (2, 7), (1, 1)])
async def test_a_websocket_visited_only_when_due_does_what_one_visited_every_tick_did(interval, timeout):
    """The same script of pongs (prompt, late, then none) and a token expiry,
    for one connection visited every tick and one taken from the wheel."""
    settings = Settings(_env_file=None,
                        daemon=DaemonSettings(ping_interval_seconds=interval, ping_timeout_seconds=timeout))
    tick = heartbeat_tick(settings)
    clock = [1000.0]
    scanned, wheeled = Sockets(), Sockets()
    every = websocket(settings, scanned, clock, expires=1000.0 + 9 * interval + 0.3)
    when_due = websocket(settings, wheeled, clock, expires=1000.0 + 9 * interval + 0.3)
    wheel: DueWheel[Connection] = DueWheel(tick / BUCKETS_PER_TICK)  # as the daemon's
    wheel.schedule(when_due, when_due.next_due())
    pong_after = [0.05, 0.4 * timeout, 0.05, 0.9 * timeout, 0.05]  # then silence: 4001 or the ping timeout
    pongs: list[float] = []
    visits = ticks = 0
    while clock[0] < 1000.0 + 12 * interval + 2 * timeout:
        clock[0] = round(clock[0] + tick, 6)
        ticks += 1
        now = clock[0]
        for conn in (every, when_due):
            if conn.ping_sent and pongs and pongs[0] <= now:
                conn.ping_sent = 0.0  # what a pong does (Connection._ws_data)
        if pongs and pongs[0] <= now:
            pongs.pop(0)
        if every in scanned:
            every.heartbeat(now)
        for conn in wheel.pop_due(now):
            visits += 1
            if conn in wheeled:
                conn.heartbeat(now)
                if conn in wheeled:
                    wheel.schedule(conn, conn.next_due())
        if every.ping_sent == now and pong_after:  # a ping went out (both sent it: compared below)
            pongs.append(now + pong_after.pop(0))
    assert every.transport.log == when_due.transport.log  # type: ignore[attr-defined]
    ends = [e for _, e in every.transport.log if e != "ping"]  # type: ignore[attr-defined]
    assert ends[-1:] in (["abort"], [close_frame(CloseCode.TOKEN_EXPIRED, "token expired: reconnect with a new "
                                                 "token and since")])
    assert visits < ticks  # and far fewer than every tick while idle
