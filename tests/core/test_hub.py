from datetime import UTC, datetime

from chat.messages import Message
from daemon.hub import Hub, Subscriber


def msg(i, sender="a", recipient="b"):
    return Message(i, sender, recipient, f"m{i}", datetime(2026, 1, 1, tzinfo=UTC))


def sub(user, since=0):
    woken = []
    s = Subscriber(user, lambda: woken.append(1), since)
    return s, woken


def test_message_goes_to_every_connection_of_recipient_and_sender():
    hub = Hub(send_queue_max=10)
    b1, _ = sub("b")
    b2, _ = sub("b")
    a1, _ = sub("a")
    c1, _ = sub("c")
    for s in (b1, b2, a1, c1):
        hub.register(s)
        s.go_live([])
    assert hub.dispatch(msg(1), "f1") == 3
    assert [i for i, _, _ in b1.take()] == [1]
    assert [i for i, _, _ in b2.take()] == [1]
    assert [i for i, _, _ in a1.take()] == [1]  # the sender's other device
    assert c1.take() == []


def test_message_to_self_is_delivered_once_per_connection():
    hub = Hub(10)
    a, _ = sub("a")
    hub.register(a)
    a.go_live([])
    hub.dispatch(msg(1, "a", "a"), "f")
    assert len(a.take()) == 1


def test_catch_up_frames_go_before_live_frames_queued_meanwhile():
    hub = Hub(10)
    b, woken = sub("b", since=3)
    hub.register(b)
    hub.dispatch(msg(6), "f6")  # arrives while catch-up of (3, 5] runs
    assert woken == []  # not live yet: nothing is sent before the catch-up
    b.go_live([(4, "f4", None), (5, "f5", None)])
    assert [i for i, _, _ in b.take()] == [4, 5, 6]


def test_ids_at_or_below_last_sent_are_never_sent_again():
    hub = Hub(10)
    b, _ = sub("b", since=5)
    hub.register(b)
    b.go_live([(5, "f5", None)])
    hub.dispatch(msg(6), "f6")
    hub.dispatch(msg(6), "f6")
    assert [i for i, _, _ in b.take()] == [6]


def test_a_full_queue_marks_the_connection_slow_and_stops_queueing():
    hub = Hub(send_queue_max=2)
    b, woken = sub("b")
    hub.register(b)
    b.go_live([])
    for i in (1, 2, 3, 4):
        hub.dispatch(msg(i), f"f{i}")
    assert b.overflowed
    assert len(b.queue) == 2


def test_unregister_forgets_the_user_when_last_connection_leaves():
    hub = Hub(10)
    b, _ = sub("b")
    hub.register(b)
    hub.unregister(b)
    hub.unregister(b)  # idempotent
    assert hub.count == 0 and hub.connections_of("b") == 0
    assert hub.dispatch(msg(1), "f") == 0
