"""The bookkeeping of one pub/sub connection's channels (daemon/subscriptions.py), with
Redis's confirmations as inputs: what is sent, and when a watch may read its snapshot."""

from daemon.subscriptions import Subscriptions, commands


def test_a_wait_ends_once_every_channel_is_confirmed_and_not_before():
    subs = Subscriptions()
    wanted = {"a", "b"}
    subs.touch(["a", "b"])
    assert subs.wait("w", ["a", "b"]) is True
    subscribe, unsubscribe, over = subs.plan(wanted.__contains__)
    assert (sorted(subscribe), unsubscribe, over) == (["a", "b"], [], [])
    assert subs.confirmed("a") == []
    assert not subs.held("b")
    assert subs.confirmed("b") == ["w"]
    assert subs.held("a") and subs.held("b")
    assert subs.wait("w2", ["a", "b"]) is False  # held already: nothing to wait for


def test_a_channel_let_go_and_taken_again_is_held_only_after_the_second_confirmation():
    # SUBSCRIBE a, UNSUBSCRIBE a, SUBSCRIBE a: the first confirmation is of a subscription
    # that the UNSUBSCRIBE ends; a snapshot read then could miss a change published between
    # the two.
    subs = Subscriptions()
    wanted = {"a"}
    subs.touch(["a"])
    assert subs.plan(wanted.__contains__)[0] == ["a"]
    wanted.clear()
    subs.touch(["a"])
    assert subs.plan(wanted.__contains__)[1] == ["a"]
    wanted.add("a")
    subs.touch(["a"])
    assert subs.plan(wanted.__contains__)[0] == ["a"]
    assert subs.wait("w", ["a"]) is True
    assert subs.confirmed("a") == [] and not subs.held("a")
    assert subs.confirmed("a") == ["w"] and subs.held("a")


def test_a_let_go_and_a_take_between_two_plans_send_nothing():
    subs = Subscriptions()
    wanted = {"a"}
    subs.touch(["a"])
    subs.plan(wanted.__contains__)
    subs.confirmed("a")
    wanted.discard("a")
    subs.touch(["a"])
    wanted.add("a")  # watched again before the sender ran
    subs.touch(["a"])
    assert subs.plan(wanted.__contains__) == ([], [], [])
    assert subs.held("a")


def test_a_wait_on_a_channel_nobody_wants_any_more_ends_with_the_unsubscribe():
    subs = Subscriptions()
    wanted = {"a", "b"}
    subs.touch(wanted)
    subs.plan(wanted.__contains__)
    subs.confirmed("b")
    assert subs.wait("w", ["a", "b"]) is True
    wanted.discard("a")  # the watching connection closed before Redis confirmed
    subs.touch(["a"])
    assert subs.plan(wanted.__contains__) == ([], ["a"], ["w"])
    assert subs.confirmed("a") == []  # the late confirmation of a channel let go ends nothing


def test_a_new_connection_subscribes_everything_wanted_and_keeps_the_waits():
    subs = Subscriptions()
    wanted = {"t", "a"}
    subs.touch(wanted)
    subs.plan(wanted.__contains__)
    assert subs.wait("w", ["a"]) is True
    subs.reset(wanted)  # the connection was lost before the confirmation
    assert not subs.held("a") and not subs.held("t")
    subscribe, unsubscribe, over = subs.plan(wanted.__contains__)
    assert (sorted(subscribe), unsubscribe, over) == (["a", "t"], [], [])
    assert subs.confirmed("t") == []
    assert subs.confirmed("a") == ["w"]


def test_a_dropped_wait_is_forgotten():
    subs = Subscriptions()
    wanted = {"a", "b"}
    subs.touch(wanted)
    subs.plan(wanted.__contains__)
    assert subs.wait("gave up", ["a", "b"]) is True
    assert subs.wait("waits", ["a"]) is True
    subs.drop("gave up")
    subs.drop("never waited")  # harmless
    assert subs.confirmed("a") == ["waits"]
    assert subs.confirmed("b") == []


def test_many_channels_go_in_bounded_commands_in_order_and_none_sends_no_command():
    channels = [f"chat:presence:u{i}" for i in range(2_500)]
    sent = commands(channels, 1_000)
    assert [len(c) for c in sent] == [1_000, 1_000, 500]
    assert [c for command in sent for c in command] == channels
    assert commands([], 1_000) == []  # an UNSUBSCRIBE with no channel would let go of every one
