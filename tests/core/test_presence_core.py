"""Typing and presence decisions with no sockets and no Redis (daemon/presence.py,
chat/typing_gate.py, daemon/client_frames.py's parsing, the hub's signals): the
clock is an argument, so the grace and the throttle are tested by moving it."""

import orjson
import pytest

from chat.settings import Settings, SignalsSettings, StoresSettings
from chat.typing_gate import TYPING_REFRESH_SECONDS, TypingGate
from daemon.client_frames import Ack, BadClientFrame, ClientFrames, Read, Typing, Unknown, Watch, parse
from daemon.hub import Hub, Subscriber
from daemon.presence import PresenceTracker, Watchers
from daemon.signals import presence_frame
from db.presence import view
from tests.timing import eventually


def test_the_first_connection_announces_and_the_last_withdraws_after_the_grace():
    tracker = PresenceTracker(grace_seconds=3)
    assert tracker.arrive("a") is True  # first: Redis must hear of it
    assert tracker.arrive("a") is False  # a second device: nothing to say
    tracker.leave("a", now=10, wall_ms=1000)
    assert tracker.due(100) == []  # one connection is still open
    tracker.leave("a", now=11, wall_ms=2000)
    assert tracker.due(13.9) == []  # within the grace
    assert tracker.held() == {"a"}  # still listed in Redis meanwhile
    assert tracker.due(14) == [("a", 2000)]  # the grace is over: withdrawn, last seen at the end
    assert tracker.held() == set()
    assert tracker.due(100) == []  # once


def test_a_reconnect_within_the_grace_says_nothing_at_all():
    tracker = PresenceTracker(grace_seconds=3)
    tracker.arrive("a")
    tracker.leave("a", now=10, wall_ms=1000)
    assert tracker.arrive("a") is False  # back in time: no announcement (Redis still holds a)
    assert tracker.due(1000) == []  # and no withdrawal, no last_seen
    storm = [f"u{i}" for i in range(5000)]
    for user in storm:
        tracker.arrive(user)
    for user in storm:
        tracker.leave(user, now=20, wall_ms=5)
    assert [tracker.arrive(user) for user in storm] == [False] * 5000
    assert tracker.due(10_000) == []


def test_graces_end_in_the_order_connections_ended():
    tracker = PresenceTracker(grace_seconds=1)
    for i, user in enumerate(["a", "b", "c"]):
        tracker.arrive(user)
        tracker.leave(user, now=i, wall_ms=i)
    assert tracker.due(1.5) == [("a", 0)]
    assert tracker.due(3) == [("b", 1), ("c", 2)]


def test_a_leave_without_an_arrival_is_ignored():
    tracker = PresenceTracker(grace_seconds=0)
    tracker.leave("ghost", now=0, wall_ms=0)
    assert tracker.due(1) == [] and tracker.held() == set()


def test_watchers_index_follows_each_connections_newest_list():
    watchers: Watchers[str] = Watchers()
    assert watchers.watch("c1", ["a", "b", "a"]) == ("a", "b")
    watchers.watch("c2", ["b"])
    assert sorted(watchers.of("b")) == ["c1", "c2"]
    watchers.watch("c1", ["c"])  # replaces
    assert watchers.of("a") == () and watchers.of("b") == ("c2",) and watchers.of("c") == ("c1",)
    watchers.forget("c1")
    watchers.forget("c2")
    assert watchers.by_user == {} and watchers.lists == {}


def test_typing_refreshes_pass_once_a_second_per_peer_and_a_stop_always():
    gate = TypingGate(most=2)
    assert gate.passes("b", "start", 0.0)
    assert not gate.passes("b", "start", 0.5)  # a refresh within the second: dropped
    assert not gate.passes("b", "start", TYPING_REFRESH_SECONDS - 0.01)  # the window runs from the one that passed
    assert gate.passes("b", "start", TYPING_REFRESH_SECONDS)
    assert gate.passes("c", "start", 1.0)  # another peer has its own window
    assert gate.passes("b", "stop", 1.1)  # a stop always passes, and the next start is news
    assert gate.passes("b", "start", 1.2)
    assert gate.passes("d", "start", 1.3)  # a third peer: the oldest remembered is forgotten (bounded)
    assert len(gate.last) == 2


@pytest.mark.parametrize("frame, parsed", [
    ({"type": "ack", "upto": "5"}, Ack(5)),
    ({"type": "read", "peer": "bob", "upto": "7"}, Read("bob", 7)),
    ({"type": "typing", "to": "bob"}, Typing("bob", "start")),
    ({"type": "typing", "to": "bob", "state": "stop"}, Typing("bob", "stop")),
    ({"type": "watch", "users": ["a", "b"]}, Watch(["a", "b"])),
    ({"type": "watch", "users": []}, Watch([])),
    ({"type": "presence-please"}, Unknown("presence-please")),
    ({"type": "x" * 100}, Unknown("x" * 32)),
])
def test_client_frames_parse_to_their_kinds(frame, parsed):
    assert parse(orjson.dumps(frame)) == parsed


@pytest.mark.parametrize("frame", [
    {"type": "typing", "to": "not a user"},
    {"type": "typing", "to": "bob", "state": "paused"},
    {"type": "typing", "state": "start"},
    {"type": "typing", "to": "bob", "extra": 1},
    {"type": "watch", "users": "bob"},
    {"type": "watch", "users": ["bob", 7]},
    {"type": "watch"},
])
def test_malformed_typing_and_watch_frames_are_the_clients_protocol_errors(frame):
    with pytest.raises(BadClientFrame):
        parse(orjson.dumps(frame))


@pytest.mark.parametrize("data", [b"not json", b"[1]", b'{"no": "type"}', b'{"type": 5}'])
def test_data_that_is_not_a_typed_object_is_dropped(data):
    assert parse(data) is None


class FakeSignals:
    """What ClientFrames asks of daemon.signals.Signals, recorded."""

    def __init__(self, watch_max=3):
        self.typed, self.watched, self.forgotten = [], [], []
        self.settings = Settings(_env_file=None, signals=SignalsSettings(presence_watch_max=watch_max))

    def typing(self, origin, sender, to, state):
        self.typed.append((sender, to, state))

    async def watch(self, conn, users):
        self.watched.append(users)
        return orjson.dumps({"type": "presence", "users": users})

    def forget(self, conn):
        self.forgotten.append(conn)


async def test_a_connections_typing_is_throttled_by_its_clock_and_watch_lists_are_capped():
    now = [100.0]
    sent, signals = [], FakeSignals(watch_max=3)
    frames = ClientFrames("alice", "phone", None, sent.append, signals=signals, conn="conn", clock=lambda: now[0])
    for _ in range(5):
        frames.take(orjson.dumps({"type": "typing", "to": "bob"}))
    now[0] += 1.0
    frames.take(orjson.dumps({"type": "typing", "to": "bob"}))
    frames.take(orjson.dumps({"type": "typing", "to": "bob", "state": "stop"}))
    assert signals.typed == [("alice", "bob", "start"), ("alice", "bob", "start"), ("alice", "bob", "stop")]
    frames.take(orjson.dumps({"type": "watch", "users": ["a", "b", "c", "d"]}))
    assert orjson.loads(sent[-1])["code"] == "watch_too_many" and signals.watched == []
    frames.take(orjson.dumps({"type": "watch", "users": ["a", "b", "c"]}))  # at the cap
    await eventually(lambda: signals.watched, "the snapshot asked for")
    await eventually(lambda: orjson.loads(sent[-1])["type"] == "presence", "the snapshot sent")
    assert signals.watched == [["a", "b", "c"]]
    frames.take(orjson.dumps({"type": "wave"}))
    assert orjson.loads(sent[-1]) | {"message": None} == {"type": "error", "code": "unknown_type", "frame": "wave",
                                                          "message": None}
    frames.close()
    assert signals.forgotten == ["conn"]


def test_without_redis_typing_and_watch_get_signals_unavailable():
    sent = []
    frames = ClientFrames("alice", "phone", None, sent.append)
    frames.take(orjson.dumps({"type": "typing", "to": "bob"}))
    frames.take(orjson.dumps({"type": "watch", "users": ["bob"]}))
    assert [(f["code"], f["frame"]) for f in map(orjson.loads, sent)] == [("signals_unavailable", "typing"),
                                                                           ("signals_unavailable", "watch")]


class Sink:
    def __init__(self, user):
        self.signals = []
        self.subscriber = Subscriber(self, user)

    def send(self, msg_id, payload, frame):
        pass

    def overflow(self):
        pass

    def signal(self, payload):
        self.signals.append(payload)


def test_the_hub_signals_live_connections_but_the_typists_own_and_those_catching_up():
    hub = Hub(1 << 20)
    own, other, catching_up = Sink("alice"), Sink("alice"), Sink("alice")
    for sink in (own, other, catching_up):
        hub.register(sink.subscriber)
    own.subscriber.go_live([])
    other.subscriber.go_live([])
    assert hub.signal("alice", b"t", skip=id(own)) == 1
    assert (own.signals, other.signals, catching_up.signals) == ([], [b"t"], [])
    assert hub.signal("nobody", b"t") == 0


def test_presence_payloads_become_client_frames():
    assert orjson.loads(presence_frame(["1", "a"])) == {"type": "presence", "user": "a", "online": True,
                                                        "last_seen": None}
    assert orjson.loads(presence_frame(["0", "a", "1764162062345"])) == {
        "type": "presence", "user": "a", "online": False, "last_seen": "2025-11-26T13:01:02.345Z"}
    assert orjson.loads(presence_frame(["0", "a"]))["last_seen"] is None  # hidden: never seen
    assert presence_frame(["2", "a"]) is None and presence_frame(["1"]) is None


def test_a_hidden_user_reads_as_offline_and_never_seen():
    from datetime import datetime
    seen = datetime(2026, 11, 26, 13, 0, 0)
    users = ["on", "off", "hidden", "unknown"]
    rows = {"off": (seen, False), "hidden": (seen, True)}
    assert view(users, [True, False, True, False], rows) == [
        {"user": "on", "online": True, "last_seen": None},
        {"user": "off", "online": False, "last_seen": "2026-11-26T13:00:00.000Z"},
        {"user": "hidden", "online": False, "last_seen": None},
        {"user": "unknown", "online": False, "last_seen": None}]


def test_typing_waiting_for_redis_is_bounded_and_what_is_past_the_bound_is_dropped_and_counted():
    from chat.partitions import SlotMap
    from prometheus_client import REGISTRY


    from daemon.hub import Hubs
    from chat.partitions import LiveMap
    from daemon.signals import TYPING_QUEUE_MAX, Signals

    # No Redis behind it: the publishing task never runs, as when Redis answers too slowly.
    signals = Signals(Settings(stores=StoresSettings(redis_url="")), None, None, Hubs({0: Hub(1 << 20)}),
                      LiveMap(SlotMap.even(1)), None)
    def dropped() -> float:
        return REGISTRY.get_sample_value("chat_daemon_signals_total", {"kind": "typing", "outcome": "dropped"}) or 0

    before = dropped()
    for i in range(TYPING_QUEUE_MAX + 25):
        signals.typing(1, "alice", f"peer{i}", "start")
    assert len(signals._typing) == TYPING_QUEUE_MAX
    assert dropped() - before == 25
    assert signals._typing[-1][1].endswith(f"peer{TYPING_QUEUE_MAX - 1} start")  # the first ones wait, in order


def test_a_poll_answer_carries_a_bounded_number_of_typing_events():
    from daemon.server import POLL_SIGNALS_MAX, PollWaiter

    waiter = PollWaiter("bob", 0)
    for i in range(POLL_SIGNALS_MAX + 10):
        waiter.signal(f"t{i}".encode())
    assert len(waiter.signals) == POLL_SIGNALS_MAX
    assert waiter.signals[-1] == f"t{POLL_SIGNALS_MAX - 1}".encode() and waiter.wake.is_set()
