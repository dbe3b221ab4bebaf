"""The delivery bookkeeping with no sockets: who gets what, once, in order."""

from daemon.hub import Hub, Subscriber


class Recorder:
    """A connection whose socket is a list: the sink of the subscriber it holds."""

    def __init__(self, user, since=0):
        self.sent: list[int] = []
        self.closed = False
        self.subscriber = Subscriber(self, user, since)

    def send(self, msg_id, payload, frame):
        self.sent.append(msg_id)

    def overflow(self):
        self.closed = True


def live(hub, user, since=0):
    s = Recorder(user, since)
    hub.register(s.subscriber)
    s.subscriber.go_live([])
    return s


def offer(hub, i, sender="a", recipient="b"):
    return hub.dispatch(i, sender, recipient, f"m{i}".encode(), lambda payload: b"ws:" + payload)


def test_message_goes_to_every_connection_of_recipient_and_sender():
    hub = Hub(1000)
    b1, b2, a1, c1 = live(hub, "b"), live(hub, "b"), live(hub, "a"), live(hub, "c")
    assert offer(hub, 1) == 3
    assert b1.sent == [1] and b2.sent == [1]
    assert a1.sent == [1]  # the sender's other device
    assert c1.sent == []


def test_message_to_self_is_delivered_once_per_connection():
    hub = Hub(1000)
    a = live(hub, "a")
    offer(hub, 1, "a", "a")
    assert a.sent == [1]


def test_catch_up_frames_go_before_live_frames_held_meanwhile():
    hub = Hub(1000)
    b = Recorder("b", since=3)
    hub.register(b.subscriber)
    offer(hub, 6)  # arrives while the catch-up of (3, 5] runs
    assert b.sent == []  # not live yet: nothing goes out before the catch-up
    b.subscriber.go_live([(4, b"m4", None), (5, b"m5", None)])
    assert b.sent == [4, 5, 6]
    offer(hub, 7)
    assert b.sent == [4, 5, 6, 7]


def test_a_paged_catch_up_holds_live_frames_until_its_last_page():
    hub = Hub(1000)
    b = Recorder("b", since=2)
    hub.register(b.subscriber)
    b.subscriber.send_page([(3, b"m3", None), (4, b"m4", None)])
    offer(hub, 7)  # live, while the next page is read
    assert b.sent == [3, 4]
    b.subscriber.send_page([(4, b"m4", None), (5, b"m5", None)])  # a page may repeat the edge: sent once
    b.subscriber.go_live([(6, b"m6", None)])
    assert b.sent == [3, 4, 5, 6, 7]


def test_ids_at_or_below_last_sent_are_never_sent_again():
    hub = Hub(1000)
    b = Recorder("b", since=5)
    hub.register(b.subscriber)
    b.subscriber.go_live([(5, b"m5", None)])
    offer(hub, 6)
    offer(hub, 6)
    offer(hub, 4)
    assert b.sent == [6]


def test_overflow_while_catching_up_sends_the_gap_free_prefix_then_closes():
    hub = Hub(pending_max_bytes=4)  # room for two 2-byte payloads
    b = Recorder("b")
    hub.register(b.subscriber)
    for i in (1, 2, 3, 4):
        offer(hub, i)
    assert b.subscriber.overflowed and not b.closed
    b.subscriber.go_live([])
    assert b.sent == [1, 2] and b.closed  # then 4008; the client resumes after 2
    offer(hub, 5)
    assert b.sent == [1, 2]


def test_the_frame_is_encoded_once_and_only_for_a_held_target():
    hub = Hub(1000)
    encoded = []

    def encode(payload):
        encoded.append(payload)
        return payload

    assert hub.dispatch(1, "x", "y", b"m1", encode) == 0
    live(hub, "b"), live(hub, "b"), live(hub, "a")
    assert hub.dispatch(2, "a", "b", b"m2", encode) == 3
    assert encoded == [b"m2"]


def test_unregister_forgets_the_user_when_last_connection_leaves():
    hub = Hub(1000)
    b = live(hub, "b")
    hub.unregister(b.subscriber)
    hub.unregister(b.subscriber)  # idempotent
    assert hub.count == 0 and hub.connections_of("b") == 0
    assert offer(hub, 1) == 0


def test_a_connection_that_closes_while_sending_leaves_the_others_served():
    hub = Hub(1000)

    class Closing(Recorder):
        def send(self, msg_id, payload, frame):
            hub.unregister(self.subscriber)  # what the shell does on a slow consumer

    closing, other = Closing("b"), live(hub, "b")
    hub.register(closing.subscriber)
    closing.subscriber.go_live([])
    assert offer(hub, 1) == 2
    assert other.sent == [1] and hub.connections_of("b") == 1


def test_a_detached_subscriber_sends_nothing_more_and_lets_go_of_its_shell():
    hub = Hub(1000)
    b = live(hub, "b")
    offer(hub, 1)
    b.subscriber.detach()  # its shell is done: closed, or answered
    offer(hub, 2)
    b.subscriber.go_live([(3, b"m3", None)])
    assert b.sent == [1] and b.subscriber.sink is not b
