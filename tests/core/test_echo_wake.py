"""The wake of a leader's echo watch (``writer.echo_wake``): what a wake says and
what a listener makes of any other message, one publish at a time with nothing
dropped, Redis away costing one log line, and the watch's pause cut short
(``writer.echo_watch``). Through real Redis and MySQL, with two hosts' writers:
tests/e2e/test_writer_leads.py."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from chat.partitions import LiveMap, SlotMap
from writer.echo_wake import MOST_PARTITIONS_IN_A_WAKE, EchoWakes, decode, encode
from writer.echo_watch import EchoWatch


def test_a_wake_names_partitions_and_anything_else_wakes_nobody():
    assert encode({3, 0, 12}) == b"0,3,12"
    assert decode(b"0,3,12") == [0, 3, 12]
    assert decode(encode({5})) == [5]
    too_many = ",".join(["1"] * (MOST_PARTITIONS_IN_A_WAKE + 1)).encode()
    for hostile in (b"", b"x", b"1,,2", b"-1", b"1.5", b" 1", b"1000", b"1,two", too_many, b"\xff\xfe"):
        assert decode(hostile) == [], hostile


async def test_partitions_owed_while_a_publish_is_in_flight_go_in_the_next_one():
    sent: list[bytes] = []
    gate, publishing = asyncio.Event(), asyncio.Event()

    async def publish(data: bytes) -> None:
        sent.append(data)
        publishing.set()
        await gate.wait()

    wakes = EchoWakes(publish)
    wakes.owed(3)
    await publishing.wait()  # the first publish is under way
    wakes.owed(2)
    wakes.owed(0)
    wakes.owed(2)
    assert sent == [b"3"]  # one at a time
    gate.set()
    await wakes.settled()
    assert sent == [b"3", b"0,2"] and wakes.published == 2


async def test_redis_away_costs_one_line_per_outage_and_the_wakes_after_it_go_out(caplog):
    up = False
    sent: list[bytes] = []

    async def publish(data: bytes) -> None:
        if not up:
            raise RedisConnectionError("refused")
        sent.append(data)

    wakes = EchoWakes(publish)
    with caplog.at_level(logging.INFO, logger="chat.writer"):
        for k in range(3):
            wakes.owed(k)
            await wakes.settled()
        up = True
        wakes.owed(1)
        await wakes.settled()
    assert (wakes.failed, wakes.published, sent) == (3, 1, [b"1"])
    events = [r.getMessage().split()[0] for r in caplog.records]
    assert events == ["event=echo_wake_failed", "event=echo_wake_back"]


def _watch(sleep) -> EchoWatch:
    # Only its pause is driven here: it never reads, so it needs no engine.
    return EchoWatch(None, partition=1, live=LiveMap(SlotMap.even(2)), offer=lambda copy: None,  # type: ignore[arg-type]
                     interval=3600.0, limit=10, sleep=sleep)


async def test_a_wake_cuts_the_watch_s_pause_short_and_one_during_a_read_is_kept():
    periods: list[float] = []
    pausing_now = asyncio.Event()

    async def never(seconds: float) -> None:  # a period that does not end within the test
        periods.append(seconds)
        pausing_now.set()
        await asyncio.Event().wait()

    watch = _watch(never)
    try:
        pausing = asyncio.create_task(watch._pause())
        await pausing_now.wait()
        assert periods == [3600.0] and not pausing.done()
        watch.wake()
        await pausing  # woken: the period did not run out
        watch.wake()  # as if during the read that follows
        await watch._pause()  # returns at once: that wake is not lost
        assert periods == [3600.0]
    finally:
        watch.close()


async def test_a_pause_whose_period_fails_fails_the_watch():
    async def failing(seconds: float) -> None:
        raise asyncio.CancelledError

    watch = _watch(failing)
    try:
        with pytest.raises(asyncio.CancelledError):
            await watch._pause()
    finally:
        watch.close()
