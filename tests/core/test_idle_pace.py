"""The decisions that let an idle stack cost almost nothing: a FerretDB tail's
poll period backing off while idle and coming back at once on a wake
(``oplog.pace``), and the writer's wakes, published at most so often and never
in its way (``oplog.wake``). The wake through Redis, end to end, is
tests/e2e/test_idle_wake.py's."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from oplog.pace import PollPace
from oplog.wake import WakePublisher, WakeThrottle

BASE, CAP = 0.02, 1.0


def waits(pace: PollPace, polls: list[bool]) -> list[float]:
    return [round(pace.polled(got), 3) for got in polls]


def test_while_entries_come_the_tail_polls_at_the_base_pace():
    pace = PollPace(BASE, CAP, patience=3)
    assert waits(pace, [True] * 10) == [BASE] * 10
    assert not pace.backing_off


def test_after_its_patience_of_empty_polls_the_wait_doubles_up_to_the_cap():
    pace = PollPace(BASE, CAP, patience=3)
    assert waits(pace, [False] * 3) == [BASE] * 3
    assert waits(pace, [False] * 8) == [0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0, 1.0]
    assert pace.backing_off


def test_the_default_patience_is_a_second_of_empty_polls():
    assert PollPace(0.02, CAP).patience == 50
    assert PollPace(0.5, CAP).patience == 2
    assert PollPace(5.0, CAP).patience == 1


def test_an_entry_puts_the_pace_back_at_once():
    pace = PollPace(BASE, CAP, patience=2)
    waits(pace, [False] * 10)
    assert pace.polled(True) == BASE
    assert waits(pace, [False] * 3) == [BASE, BASE, 0.04]  # a whole patience again before backing off


def test_a_wake_cuts_a_backoff_short_and_the_base_pace_is_kept():
    pace = PollPace(BASE, CAP, patience=2)
    waits(pace, [False] * 6)
    assert pace.woken() is True
    assert pace.delay == BASE and not pace.backing_off
    assert waits(pace, [False] * 3) == [BASE, BASE, 0.04]


def test_a_wake_at_the_base_pace_changes_nothing():
    """Under traffic the tail polls as it always did: a wake does not add polls."""
    pace = PollPace(BASE, CAP, patience=2)
    pace.polled(True)
    assert pace.woken() is False
    assert pace.delay == BASE


def test_a_cap_below_the_base_pace_never_backs_off():
    pace = PollPace(BASE, 0.01, patience=1)
    assert waits(pace, [False] * 5) == [BASE] * 5


def test_no_poll_period_is_refused():
    with pytest.raises(ValueError):
        PollPace(0, CAP)


def test_the_first_wake_after_quiet_is_published_at_once_then_one_per_interval():
    throttle = WakeThrottle(every=0.2)
    assert throttle.due(100.0)
    assert not throttle.due(100.05) and not throttle.due(100.19)
    assert throttle.due(100.2)
    assert throttle.due(500.0)  # after a quiet spell: at once


def test_the_wake_interval_is_shorter_than_the_tail_s_patience():
    """A wake skipped by the throttle follows one the tails got less than a patience ago:
    they poll at the base pace still, so none waits on a backoff for it."""
    from oplog import pace, wake

    assert wake.WAKE_EVERY < pace.IDLE_AFTER_SECONDS


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_publisher_never_waits_and_folds_wakes_while_one_is_in_flight():
    clock, started, released, calls = Clock(), asyncio.Event(), asyncio.Event(), []

    async def publish() -> None:
        calls.append(clock.now)
        started.set()
        await released.wait()

    publisher = WakePublisher(publish, clock=clock, every=0.2)
    publisher.wake()  # returns at once: the publish runs in the background
    await started.wait()
    clock.now = 5.0
    publisher.wake()  # one in flight: this one is not queued behind it
    released.set()
    await publisher.settled()
    assert (calls, publisher.published) == ([0.0], 1)
    publisher.wake()  # due (5 s since the last), and none in flight
    await publisher.settled()
    assert (calls, publisher.published) == ([0.0, 5.0], 2)


async def test_a_failed_publish_is_passed_over_and_logged_once_per_outage(caplog):
    caplog.set_level(logging.INFO, "chat.oplog")
    clock, outcomes = Clock(), [RedisConnectionError("away"), OSError("refused"), None]

    async def publish() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    publisher = WakePublisher(publish, clock=clock, every=0.2)
    for done in (1, 2, 3):
        publisher.wake()
        await publisher.settled()
        assert publisher.published + publisher.failed == done
        clock.now += 1.0
    assert (publisher.failed, publisher.published) == (2, 1)
    assert caplog.text.count("event=wake_publish_failed") == 1
    assert caplog.text.count("event=wake_publish_back") == 1
