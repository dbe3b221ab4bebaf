"""Asks that come while reads are busy wait for the next free read, which answers them
together (``db.batched_reads.BatchedReads``): driven by a blocking read the test releases,
on the threads it would run on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from db.batched_reads import BatchedReads
from db.threads import Threads


class Reads:
    """A blocking read that records what each call was asked, and holds each until released."""

    def __init__(self, fail_on: str | None = None):
        self.calls: list[list[str]] = []
        self.release = threading.Semaphore(0)
        self.started = threading.Semaphore(0)
        self._fail_on = fail_on

    def __call__(self, asks: list[str]) -> list[str]:
        self.calls.append(list(asks))
        self.started.release()
        self.release.acquire()
        if self._fail_on in asks:
            raise RuntimeError("the read failed")
        return [ask.upper() for ask in asks]

    async def wait_started(self) -> None:
        await asyncio.to_thread(self.started.acquire)


def at_most(most: int):
    def choose(waiting: Sequence[str]) -> list[int]:
        return list(range(min(len(waiting), most)))
    return choose


@pytest.fixture
def threads():
    pool = Threads(2, "test-reads")
    yield pool
    pool.close()


async def test_an_ask_alone_is_read_at_once_and_those_asked_meanwhile_share_the_next_read(threads):
    read = Reads()
    reads = BatchedReads(threads, read, at_most(10), in_flight=1)
    first = reads.ask("a")
    await read.wait_started()
    later = [reads.ask(user) for user in ("b", "c", "d")]
    assert read.calls == [["a"]]
    read.release.release()
    assert await first == "A"
    await read.wait_started()
    assert read.calls == [["a"], ["b", "c", "d"]]
    read.release.release()
    assert await asyncio.gather(*later) == ["B", "C", "D"]


async def test_a_read_takes_what_choose_picks_and_the_rest_wait_for_the_one_after(threads):
    read = Reads()
    reads = BatchedReads(threads, read, at_most(2), in_flight=1)
    answers = [reads.ask("a")]
    await read.wait_started()
    answers += [reads.ask(user) for user in ("b", "c", "d", "e", "f")]
    for _ in range(4):
        read.release.release()
    assert await asyncio.gather(*answers) == ["A", "B", "C", "D", "E", "F"]
    assert read.calls == [["a"], ["b", "c"], ["d", "e"], ["f"]]


async def test_up_to_in_flight_reads_run_at_once_before_any_ask_waits(threads):
    read = Reads()
    reads = BatchedReads(threads, read, at_most(10), in_flight=2)
    a, b = reads.ask("a"), reads.ask("b")
    await read.wait_started()
    await read.wait_started()
    c, d = reads.ask("c"), reads.ask("d")
    assert sorted(map(tuple, read.calls)) == [("a",), ("b",)]
    for _ in range(3):
        read.release.release()
    assert await asyncio.gather(a, b, c, d) == ["A", "B", "C", "D"]
    assert sorted(map(tuple, read.calls)) == [("a",), ("b",), ("c", "d")]


async def test_a_read_s_error_is_each_of_its_asks_and_the_next_read_still_runs(threads):
    read = Reads(fail_on="b")
    reads = BatchedReads(threads, read, at_most(10), in_flight=1)
    first = reads.ask("a")
    await read.wait_started()
    failing = [reads.ask("b"), reads.ask("c")]
    read.release.release()
    assert await first == "A"
    await read.wait_started()
    after = reads.ask("d")  # asked while the failing read runs
    read.release.release()
    for answer in failing:
        with pytest.raises(RuntimeError, match="the read failed"):
            await answer
    read.release.release()
    assert await after == "D"
    assert read.calls == [["a"], ["b", "c"], ["d"]]


async def test_an_ask_given_up_before_its_read_is_not_read(threads):
    read = Reads()
    reads = BatchedReads(threads, read, at_most(10), in_flight=1)
    first = reads.ask("a")
    await read.wait_started()
    gone, kept = reads.ask("b"), reads.ask("c")
    gone.cancel()  # its waiter went: a client that left before its hello
    read.release.release()
    assert await first == "A"
    read.release.release()
    assert await kept == "C"
    assert read.calls == [["a"], ["c"]]
