"""The pusher's decisions (pusher/core.py), on rows, clocks and answers given as values."""

import random
from datetime import UTC, datetime, timedelta

import pytest

from chat.messages import Kind, Message
from pusher.core import Device, due, gives_up, missed, notifications, pause, rejected_pushkeys, retry_in

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def row(msg_id: int, sender: str = "ann", recipient: str = "ben", seconds: float = 0, **kw) -> Message:
    return Message(msg_id, sender, recipient, f"m{msg_id}", T0 + timedelta(seconds=seconds), **kw)


def test_rows_are_decided_in_id_order_up_to_the_first_still_within_its_delay():
    rows = [row(1, seconds=0), row(2, seconds=1), row(3, seconds=5), row(4, seconds=2)]
    taken, upto, next_due = due(rows, T0 + timedelta(seconds=4), delay_seconds=3)
    assert ([r.id for r in taken], upto) == ([1, 2], 2)  # 4 is old enough, but 3 before it is not
    assert next_due == T0 + timedelta(seconds=8)  # 3's
    assert due(rows, T0, 3) == ([], None, T0 + timedelta(seconds=3))
    assert due(rows[:2], T0 + timedelta(seconds=9), 3)[2] is None


def test_a_pusher_with_nothing_due_waits_for_the_next_row_within_bounds():
    assert pause(T0 + timedelta(seconds=0.5), T0, tick=0.1, longest=1.0) == 0.5
    assert pause(T0 + timedelta(seconds=0.01), T0, tick=0.1, longest=1.0) == 0.1  # due soon: rows decided together
    assert pause(T0 + timedelta(seconds=5), T0, tick=0.1, longest=1.0) == 1.0  # retries come due meanwhile
    assert pause(None, T0, tick=0.1, longest=1.0) == 0.1


def test_what_no_device_received_nor_its_user_read_is_missed():
    rows = [row(1), row(2), row(3), row(4, deleted=True), row(5, kind=Kind.EDIT), row(6, "ben", "ann"),
            row(7, "cy", "ben"), row(8, "ann", "dee")]
    got = missed(rows, lives_here=lambda u: u != "dee", acked={"ben": 1}, read={("ben", "ann"): 2})
    assert {u: [r.id for r in rs] for u, rs in got.items()} == {"ben": [3, 7], "ann": [6]}


def test_a_message_sent_before_the_give_up_time_is_not_news_any_more():
    rows = [row(1, seconds=0), row(2, seconds=10), row(3, seconds=11)]  # 1: history a move copied in, say
    got = missed(rows, lives_here=lambda u: True, acked={}, read={}, sent_after=T0 + timedelta(seconds=10))
    assert [r.id for r in got["ben"]] == [2, 3]


@pytest.mark.parametrize("content, extra", [
    ("none", {}),
    ("sender", {"sender": "cy"}),
    ("full", {"sender": "cy", "content": {"msgtype": "m.text", "body": "m7"}}),
])
def test_one_notification_per_device_for_the_newest_of_a_window(content, extra):
    devices = [Device("ben", "phone", "app", "pk1", {"a": 1}), Device("ben", "tablet", "app", "pk2")]
    notes = notifications(3, "ben", [row(5), row(7, "cy")], devices, unread=4, content=content)
    assert [(n.key, n.device) for n in notes] == [("3:7:ben:phone", "phone"), ("3:7:ben:tablet", "tablet")]
    assert notes[0].request == {"notification": {
        "event_id": "7", "room_id": "cy", "type": "m.room.message", "prio": "high",
        "counts": {"unread": 4, "missed_calls": 0},
        "devices": [{"app_id": "app", "pushkey": "pk1", "data": {"a": 1}}], **extra}}


def test_retries_back_off_exponentially_with_jitter_and_give_up_in_time():
    rng = random.Random(1)
    waits = [retry_in(n, rng) for n in range(1, 10)]
    assert all(cap / 2 <= w <= cap for w, cap in zip(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60], strict=True))
    assert not gives_up(T0, T0 + timedelta(seconds=600), 600)
    assert gives_up(T0, T0 + timedelta(seconds=601), 600)


@pytest.mark.parametrize("answer, pushkeys", [
    ({"rejected": ["a", "b"]}, ["a", "b"]), ({"rejected": []}, []), ({}, []), (None, []),
    ({"rejected": "a"}, []), ({"rejected": ["a", 5]}, ["a"]),
])
def test_the_gateway_s_rejected_pushkeys(answer, pushkeys):
    assert rejected_pushkeys(answer) == pushkeys
