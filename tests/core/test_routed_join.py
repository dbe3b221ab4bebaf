"""A user's first socket on a daemon routed by user (``Stream.hold``,
``Stream.join``, daemon/interest.py), on fake relay frames: it registers as
soon as the relay's marker has come, whatever the stream still holds below
the marker (a hole, ids held for MySQL), as a socket on a daemon of whole
namespaces registers at once; and its messages among the ids passed over
before the marker, which the stream had only as ids, still reach it live,
once and in order, because those ids are read back whole."""

from __future__ import annotations

import asyncio

import pytest

from chat.settings import Settings
from daemon import server as server_module
from daemon.hub import Hub, Subscriber
from daemon.server import Behind, Daemon
from daemon.stream import Stream
from daemon.tail_reader import FillRequest
from oplog.events import Subscribed
from tests.relay_frames import NS, Sink, batch, doc
from tests.timing import PATIENCE, eventually


class FakeRelay:
    """The daemon's relay client as a stream sees it: the subs it was asked, numbered."""

    by_user = True
    namespace = NS
    last_ts = None

    def __init__(self) -> None:
        self.subs: list[str] = []

    def want(self, namespace: str, user: str) -> int:
        self.subs.append(user)
        return len(self.subs)

    def drop(self, namespace: str, user: str) -> None:
        pass


def routed_stream() -> tuple[Stream, Hub]:
    relay, hub = FakeRelay(), Hub(1 << 20)
    # No database is reached here: the test is the truth reader, and hands the stream what it would read.
    stream = Stream(None, relay, hub, retention_seconds=86400, cache_max=100,  # type: ignore[arg-type]
                    gap_check_seconds=1.0, relay=relay)  # type: ignore[arg-type]
    stream.consumer.start_at(0)
    return stream, hub


def fill_requested(stream: Stream) -> bool:
    items = []
    while not stream.inbox.empty():
        items.append(stream.inbox.get_nowait()[0])
    return any(isinstance(item, FillRequest) for item in items)


async def test_a_first_socket_is_not_held_behind_a_hole_below_the_marker_and_gets_every_message_once_in_order():
    stream, hub = routed_stream()
    m = {i: doc(i, "s", "u" if i in (1, 3, 6) else "z") for i in range(1, 8)}
    # Before u is asked for: 1, 3 and 4 come as ids passed over (1 and 3 are u's); 2 never
    # came (a writer that died between MySQL and the fast store): a hole, 3 and 4 held above it.
    stream.consumer.take(batch([], [m[1], m[3], m[4]]), 0.0)
    assert stream.position == 1 and stream.consumer.seq.hole == (1, 4)

    # u's first socket asks the relay; nothing of the relay's has come yet (timeout 0: it does not wait).
    assert await stream.hold("u", 0) is False
    assert stream._relay.subs == ["u"]  # type: ignore[union-attr]
    stream.consumer._step(Subscribed(NS, 1), 0.0)  # the relay's marker: u is served past 4
    assert stream.interest is not None and stream.interest.covered_from("u") == 4
    # The marker has come: the socket registers now, with 2 still a hole below it, as a socket
    # registers at once on a daemon of whole namespaces (it waited here until 2 was filled, or HOLD_WAIT).
    assert await stream.hold("u", 0) is True

    stream.join("u")  # with no await from here to the register, as Daemon.subscribe does
    position = stream.position
    sink = Sink()
    sub = Subscriber(sink, "u", since=position)
    sub.pending = None  # its catch-up (since, position] from the store went out: live from here
    hub.register(sub)
    assert position == 1
    # 3 and 4 were only ids: they are holes again, and a read of the truth is asked for at once,
    # so that 3 reaches u whole. Released as they were, 3 would have gone out blank, to nobody.
    assert stream.consumer.seq.held == 0 and fill_requested(stream)

    # After the marker every entry of u's comes whole: 6 is sent, 5 and 7 passed over.
    stream.consumer.take(batch([m[6]], [m[5], m[7]]), 0.0)
    assert sink.ids == []  # above the hole
    # The truth reader fills 2..4 from MySQL (``TruthReader._replace_held``): the rows, whole.
    stream.consumer.release_held(stream.consumer.seq.offer_truth([m[2], m[3], m[4]]))
    assert stream.position == 7
    assert sink.ids == [3, 6]  # 1 was its catch-up's; 3 and 6 live, once, in order


async def test_a_first_socket_with_nothing_held_below_the_marker_asks_for_no_read():
    stream, hub = routed_stream()
    assert await stream.hold("u", 0) is False
    stream.consumer.take(batch([], [doc(1, "s", "z"), doc(2, "s", "z")]), 0.0)
    stream.consumer._step(Subscribed(NS, 1), 0.0)
    assert await stream.hold("u", 0) is True
    stream.join("u")
    assert stream.position == 2 and not fill_requested(stream)



async def test_a_marker_wakes_the_sockets_of_the_users_it_serves_and_no_other():
    # A restart's reconnects leave thousands of first sockets waiting, each user with its
    # own sub and marker: a marker that woke every waiting socket cost a wake-up per waiter.
    stream, _hub = routed_stream()
    interest = stream.interest
    assert interest is not None
    looked: list[str] = []  # whose coverage a waiting socket looked at, once woken
    covered_from = interest.covered_from
    interest.covered_from = lambda user: looked.append(user) or covered_from(user)  # type: ignore[method-assign]
    waiting = {user: asyncio.create_task(stream.hold(user, PATIENCE)) for user in ("u", "v", "w")}
    await eventually(lambda: looked == ["u", "v", "w"], "each first socket has asked, and waits")
    assert stream._relay.subs == ["u", "v", "w"]  # type: ignore[union-attr]

    stream.consumer._step(Subscribed(NS, 2), 0.0)  # the marker of u's and v's subs
    assert await waiting["u"] is True and await waiting["v"] is True
    assert looked[3:] == ["u", "v"] and not waiting["w"].done()  # w's socket slept on
    stream.consumer._step(Subscribed(NS, 3), 0.0)
    assert await waiting["w"] is True
    assert looked[5:] == ["w"]


async def test_a_user_let_go_after_its_socket_gave_up_on_its_marker_leaves_nothing_waiting():
    stream, _hub = routed_stream()
    interest = stream.interest
    assert interest is not None
    assert await stream.hold("x", 0) is False  # no marker within its wait: the socket goes
    generation = interest.release("x")
    assert generation is not None
    stream._expire("x", generation)  # the linger is over: the relay is told, the wait forgotten
    assert len(interest) == 0 and stream._marked == {}
    stream.consumer._step(Subscribed(NS, 1), 0.0)  # its marker, late: it serves nobody
    assert interest.covered_from("x") is None


async def test_a_first_socket_whose_marker_does_not_come_in_time_is_told_to_retry_and_says_why(monkeypatch):
    monkeypatch.setattr(server_module, "HOLD_WAIT", 0)
    stream, hub = routed_stream()
    daemon = Daemon(Settings(), hub, stream)
    with pytest.raises(Behind) as refused:
        await daemon.subscribe(Subscriber(Sink(), "u"), 0)
    # 1013 to the socket; chat_daemon_rejects_total tells this from a daemon behind the since
    assert refused.value.reason == "no_marker"
    assert hub.count == 0 and stream.interest is not None and stream.interest.covered_from("u") is None
