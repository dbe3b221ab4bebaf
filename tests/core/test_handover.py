"""A daemon on a new slot map (``daemon.handover``), without databases: who
is handed over (pure), which partitions it must serve anew, the swap itself
on real connections over a transport that records what is written (the
moved user's WebSocket gets 1012 and its waiting poll is answered, the
others are left alone, and every decision reads the new map from then on),
and the follow loop on a grown map: the new partition served in place when
its streams can be built, a restart when they cannot."""

import asyncio
import logging

from chat.errors import CloseCode
from chat.partitions import SlotMap, slot_of
from chat.settings import DaemonSettings, Settings, TailSettings
from daemon.connection import Connection
from daemon import handover
from daemon.handover import build_bound, hand_over, release_bound
from daemon.partition_streams import Partitions
from daemon.hub import Hub, Hubs, Subscriber
from chat.partitions import LiveMap
from daemon.partitioning import handed_over, partitions_to_add
from daemon.routes import Router
from daemon.server import Daemon, PollWaiter
from daemon.websocket import SLOT_MOVED
from daemon.wire import close_frame
from tests.timing import eventually

TWO = SlotMap.even(2)


def users_in(partition: int, count: int, slot_map: SlotMap = TWO) -> list[str]:
    """``count`` users of ``partition``, each in a slot of its own."""
    found: dict[int, str] = {}
    for i in range(100_000):
        user = f"user{i}"
        if slot_map.partition_of(user) == partition:
            found.setdefault(slot_of(user), user)
            if len(found) == count:
                return list(found.values())
    raise AssertionError("not enough users")


def test_only_users_whose_slot_moved_away_from_a_served_partition_are_handed_over():
    ann, bob = users_in(0, 2)
    cid, dan = users_in(1, 2)
    users = [ann, bob, cid, dan]
    new = TWO.move([slot_of(ann)], 1).move([slot_of(dan)], 0)  # epoch 2
    assert handed_over(TWO, new, {0, 1}, users) == {ann, dan}
    assert handed_over(TWO, new, {0}, users) == {ann}  # a daemon of partition 0 holds no client of dan's
    assert handed_over(TWO, new, {1}, users) == {dan}
    assert handed_over(new, new, {0, 1}, users) == set()  # the same map again: nothing moved
    # A slot that moved before the map the daemon already holds is not moved again.
    first = TWO.move([slot_of(ann)], 1)
    assert handed_over(first, first.move([slot_of(dan)], 0), {0, 1}, users) == {dan}
    # Away and back between two maps the daemon saw: its socket missed what was written for it
    # in the other partition meanwhile, and its cursors no longer resume.
    back = first.move([slot_of(ann)], 0)
    assert back.partition_of(ann) == 0
    assert handed_over(TWO, back, {0, 1}, users) == {ann}


def test_a_daemon_restarts_only_for_a_partition_it_would_serve_and_has_no_stream_for():
    grown = TWO.grown(3)
    assert partitions_to_add("", frozenset({0, 1}), grown) == {2}  # "all" now means three
    assert partitions_to_add("0,1", frozenset({0, 1}), grown) == set()
    assert partitions_to_add("1", frozenset({1}), grown) == set()
    assert partitions_to_add("", frozenset({0, 1}), TWO.move([5], 1)) == set()  # a move within the two


def test_the_release_wait_is_a_drains_grace_or_three_gap_checks():
    assert release_bound(Settings(_env_file=None, daemon=DaemonSettings(drain_seconds=5, gap_check_seconds=1))) == 5
    assert release_bound(Settings(_env_file=None, daemon=DaemonSettings(drain_seconds=1, gap_check_seconds=2))) == 6


class Transport:
    def __init__(self):
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


def websocket(daemon: Daemon, user: str) -> tuple[Connection, Transport]:
    """A connection as ``daemon.websocket`` leaves it once its user is served: in its partition's hub."""
    conn = Connection(daemon.state, Router(daemon))
    transport = Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.http = None
    daemon.state.http_conns.discard(conn)
    conn.subscriber = Subscriber(conn, user, partition=daemon.partition_of(user, None))
    daemon.join(conn)
    daemon.hub.register(conn.subscriber)
    return conn, transport


def poll(daemon: Daemon, user: str) -> PollWaiter:
    """A long-poll as ``daemon.routes.poll`` leaves it while it waits."""
    waiter = PollWaiter(user, 0, daemon.partition_of(user, None))
    daemon.polls.add(waiter)
    daemon.hub.register(waiter.subscriber)
    return waiter


async def test_the_swap_closes_the_moved_users_sockets_with_1012_answers_their_polls_and_keeps_the_rest():
    settings = Settings(_env_file=None)
    daemon = Daemon(settings, Hubs({0: Hub(1 << 20), 1: Hub(1 << 20)}), None, maps=LiveMap(TWO))
    mover, stayer = users_in(0, 2)
    mover_ws, mover_transport = websocket(daemon, mover)
    stayer_ws, stayer_transport = websocket(daemon, stayer)
    mover_poll, stayer_poll = poll(daemon, mover), poll(daemon, stayer)
    assert daemon.resume_point("0.0.7", mover) == 7

    new = TWO.move([slot_of(mover)], 1)
    done = hand_over(daemon, new)

    assert (done.users, done.sockets, done.polls) == (1, 1, 1)
    assert mover_transport.written == [close_frame(CloseCode.RESTART, SLOT_MOVED)] and mover_transport.closed
    assert mover_ws not in daemon.sockets
    assert daemon.hub.by_partition[0].connections_of(mover) == 1  # its poll, until its answer unregisters it
    assert mover_poll.wake.is_set()
    assert stayer_transport.written == [] and not stayer_transport.closed and stayer_ws in daemon.sockets
    assert not stayer_poll.wake.is_set()
    # Every decision reads the new map now: where the mover is served, its old cursor, new cursors.
    assert daemon.slot_map is new and daemon.partition_of(mover, None) == 1
    assert daemon.resume_point("0.0.7", mover) is None
    assert daemon.cursor(0, 9) == "0.1.9"
    assert not daemon.still_serves(mover, 0) and daemon.still_serves(stayer, 0)


def following(monkeypatch, *maps: SlotMap) -> None:
    """``handover.follow`` sees ``maps`` one after the other, then no newer one."""
    queue = list(maps)

    async def next_map(engine, epoch: int, period: float) -> SlotMap:
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()  # no newer map: waits until the test cancels it
        raise AssertionError("unreachable")

    monkeypatch.setattr(handover, "next_map", next_map)


async def test_a_grown_map_is_served_in_place_when_its_streams_are_built_else_the_daemon_restarts(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="chat.daemon")
    settings = Settings(_env_file=None)  # CHAT_DAEMON_PARTITIONS empty: every partition
    grown = TWO.grown(3)
    [newcomer] = users_in(2, 1, grown)

    following(monkeypatch, grown)
    daemon = Daemon(settings, Hubs({0: Hub(1 << 20), 1: Hub(1 << 20)}), None, maps=LiveMap(TWO))
    assert await handover.follow(daemon, None, settings) is grown  # type: ignore[arg-type]  # no grow: restart
    assert "new_epoch=1 moved_users_closed=0 sockets=0 polls=0 action=restart new_partitions=2" in caplog.text
    assert daemon.slot_map is grown and daemon.served == {0, 1}

    following(monkeypatch, grown)
    daemon = Daemon(settings, Hubs({0: Hub(1 << 20), 1: Hub(1 << 20)}), None, maps=LiveMap(TWO))
    asked = []

    async def grow(partitions: frozenset[int], slot_map: SlotMap) -> Partitions:
        asked.append((partitions, slot_map))
        return Partitions(slot_map, {}, Hubs({2: Hub(1 << 20)}), None)

    follow = asyncio.create_task(handover.follow(daemon, None, settings, grow))  # type: ignore[arg-type]
    await eventually(lambda: daemon.slot_map is grown, "the grown map swapped in")
    assert asked == [(frozenset({2}), grown)]
    assert daemon.served == {0, 1, 2} and daemon.partition_of(newcomer, None) == 2
    assert "action=handed_over new_partitions=2" in caplog.text
    assert not follow.done()  # still following, for the next map
    follow.cancel()
    await asyncio.gather(follow, return_exceptions=True)


def test_new_partitions_are_waited_for_as_long_as_a_tail_may_stay_silent_before_a_restart():
    settings = Settings(_env_file=None, daemon=DaemonSettings(drain_seconds=5, gap_check_seconds=1),
                        tail=TailSettings(silence_seconds=30))
    assert build_bound(settings) == 30
    longer_drain = Settings(_env_file=None, daemon=DaemonSettings(drain_seconds=45),
                            tail=TailSettings(silence_seconds=30))
    assert build_bound(longer_drain) == 45
