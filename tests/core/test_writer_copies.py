"""Where a message is written, which copies it owes and who makes them (writer/copies.py,
``writer.partitioned.idle_turn_every``): pure, no database."""

from datetime import UTC, datetime

from chat.messages import Message
from chat.partitions import SlotMap
from writer.copies import (
    Copy,
    Echo,
    Known,
    Offers,
    OwedRead,
    copy_message,
    copy_plan,
    echo_rows,
    home_of,
    owed_copies,
)
from writer.partitioned import NOT_LED_IDLE_TURN_SECONDS, idle_turn_every

FOUR = SlotMap.even(4)
AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def user_in(partition: int, slot_map: SlotMap = FOUR, start: int = 0) -> str:
    return next(f"u{i}" for i in range(start, 100_000) if slot_map.partition_of(f"u{i}") == partition)


def msg(msg_id: int, sender: str, recipient: str, client_msg_id: str | None = None) -> Message:
    return Message(msg_id, sender, recipient, "hi", AT, client_msg_id)


def test_a_message_is_written_in_its_sender_s_partition():
    for k in range(4):
        assert home_of(user_in(k), FOUR) == k
    assert home_of(user_in(3), SlotMap.even(1)) == 0


def test_only_messages_to_another_partition_owe_a_copy_there():
    a, a2, b, c = user_in(1), user_in(1, start=5000), user_in(2), user_in(3)
    new = [msg(7, a, b), msg(8, a, a2), msg(9, a, c), msg(10, a, a)]
    owed = owed_copies(new, 1, FOUR)
    assert [(to, copy.from_part, copy.original.id) for to, copy in owed] == [(2, 1, 7), (3, 1, 9)]
    assert echo_rows(owed) == [Echo(2, 1, 7), Echo(3, 1, 9)]


def test_one_partition_owes_nothing_and_copies_owe_nothing_further():
    a, b = user_in(1), user_in(2)
    assert owed_copies([msg(1, a, b)], 0, SlotMap.even(1)) == []
    copy = Message(4, a, b, "hi", AT, None, origin_part=1, origin_id=7)  # a copy written in b's partition 2
    assert owed_copies([copy], 2, FOUR) == []


def test_a_copy_keeps_the_original_s_time_and_key_and_names_its_origin():
    original = msg(7, user_in(1), user_in(2), "c1")
    made = copy_message(Copy(original, 1), 41, keep_client_msg_id=True)
    assert made == Message(41, original.sender, original.recipient, "hi", AT, "c1", origin_part=1, origin_id=7)
    assert made.to_doc()["origin_part"] == 1 and made.to_doc()["origin_id"] == 7
    assert "origin_part" not in original.to_doc()  # an original's document has the shape of an unpartitioned one
    assert copy_message(Copy(original, 1), 41, keep_client_msg_id=False).client_msg_id is None


def test_a_copy_already_made_is_not_made_again_and_a_taken_key_is_dropped():
    original = msg(7, user_in(1), user_in(2), "c1")
    copy = Copy(original, 1)
    assert copy_plan(copy, Known.nothing()) == (True, True)
    stored = copy_message(copy, 41, True)
    assert copy_plan(copy, Known({}, {(1, 7): stored})) == (False, False)
    other = Message(3, original.sender, "x", "other", AT, "c1")  # the key names another message there
    assert copy_plan(copy, Known({(original.sender, "c1"): other}, {})) == (True, False)
    assert copy_plan(Copy(msg(8, original.sender, original.recipient), 1), Known({}, {(1, 7): stored})) == (True, True)


def test_a_handed_over_copy_is_made_already_only_if_a_complete_read_after_its_hand_over_found_no_echo():
    read = OwedRead([], frozenset({(1, 7)}), complete=True, handed_before=3)
    assert read.made_already((1, 8), handed=2)  # handed before the read, and its echo was gone
    assert not read.made_already((1, 7), handed=2)  # still owed: this writer makes it
    assert not read.made_already((1, 8), handed=3)  # handed after the read began: its echo may be newer than it
    assert not read.made_already((1, 8), handed=None)  # drained from the echoes, not handed over
    partial = OwedRead([], frozenset({(1, 7)}), complete=False, handed_before=3)
    assert not partial.made_already((1, 8), handed=2)  # the read stopped at its limit: (1, 8) may be past it


def test_a_leader_s_watch_offers_each_owed_copy_once_again_only_if_still_owed_a_second_later():
    a, b = user_in(1), user_in(2)
    first, second = Copy(msg(7, a, b), 1), Copy(msg(8, a, b), 1)
    offers = Offers(again_after=1.0)
    assert offers.fresh([first], complete=True, now=10.0) == [first]
    # read again before its copy's commit: offered already, not twice
    assert offers.fresh([first, second], complete=True, now=10.02) == [second]
    # still owed a second after its offer (the offer was lost: a full queue, a failed turn): again
    assert offers.fresh([first, second], complete=True, now=11.0) == [first]
    # made: a complete read no longer holds it, so it is forgotten; owed anew (a move sent it
    # back), it is offered at once
    assert offers.fresh([second], complete=True, now=11.01) == []
    assert offers.fresh([first, second], complete=True, now=11.015) == [first]


def test_what_the_watch_remembers_stays_within_a_read_while_a_backlog_lasts():
    """Reads stopped at their limit (a backlog past it) never prove a copy made by leaving it
    out, but what they did reach does: the oldest echoes, in origin order."""
    a, b = user_in(1), user_in(2)
    offers, limit = Offers(again_after=1.0), 10
    for start in range(0, 1000, 5):  # each read: the 10 oldest still owed; 5 of them copied since the last
        read = [Copy(msg(i, a, b), 1) for i in range(start, start + limit)]
        offers.fresh(read, complete=False, now=float(start))
        assert len(offers) <= limit
    # a partial read that this partition no longer owns any of (all sent on) forgets nothing
    assert offers.fresh([], complete=False, now=2000.0) == [] and len(offers) == limit


def test_a_partial_read_forgets_nothing_it_did_not_reach():
    a, b = user_in(1), user_in(2)
    first, second = Copy(msg(7, a, b), 1), Copy(msg(8, a, b), 1)
    offers = Offers(again_after=1.0)
    assert offers.fresh([first, second], complete=True, now=10.0) == [first, second]
    # a read stopped at its limit before (1, 8): that one may still be owed and offered
    assert offers.fresh([first], complete=False, now=10.5) == []
    assert offers.fresh([first, second], complete=True, now=10.6) == []


def test_a_writer_of_a_partition_led_elsewhere_takes_an_idle_turn_every_few_seconds_not_every_second():
    assert idle_turn_every(1, None, 1.0) == 1.0  # no leaders: every writer leads every partition
    assert idle_turn_every(1, frozenset({1, 4}), 1.0) == 1.0  # its own
    assert idle_turn_every(2, frozenset({1, 4}), 1.0) == NOT_LED_IDLE_TURN_SECONDS  # the leader's, elsewhere
    assert idle_turn_every(2, frozenset({1, 4}), 3600.0) == 3600.0  # never more often than asked


def test_each_copy_committed_is_counted_with_its_lag_behind_its_original_s_stamp():
    from prometheus_client import REGISTRY, CollectorRegistry

    from chat.loop_histogram import LoopHistogram
    from writer import metrics

    lag = LoopHistogram("test_copy_lag_seconds", "copies' lag", buckets=(0.05, 0.1, 1.0), registry=CollectorRegistry())
    observe = metrics.copies_observer(7, lag, clock=lambda: 1_000.120)

    def counted() -> float:
        return REGISTRY.get_sample_value("chat_writer_copies_total", {"partition": "7"}) or 0.0

    before = counted()
    stamp = datetime.fromtimestamp(1_000.0, UTC)
    copies = [Message(5, "a", "b", "x", stamp, None, 1, 11), Message(6, "a", "b", "y", stamp, None, 2, 3)]
    observe(copies)
    observe([])  # a commit of originals only
    (family,) = lag.collect()
    samples = {s.name + s.labels.get("le", ""): s.value for s in family.samples}
    assert samples["test_copy_lag_seconds_count"] == 2
    assert samples["test_copy_lag_seconds_bucket0.1"] == 0 and samples["test_copy_lag_seconds_bucket1.0"] == 2
    assert abs(samples["test_copy_lag_seconds_sum"] - 0.24) < 1e-6
    assert counted() == before + 2
