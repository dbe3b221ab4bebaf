"""The fanout that splits one oplog source among the streams of several
partitions: each partition's queue is bounded, and past the bound the fanout
stops reading the source (back-pressure) until that partition's reader takes
its batches again; nothing is dropped, and each partition gets its entries in order."""

import asyncio

from bson import Timestamp

from oplog import fanout as fanout_module
from oplog.events import Batch, OplogEvent
from oplog.fanout import Fanout
from tests.timing import eventually

NS0, NS1 = "chat.messages", "chat.messages_p1"
BOUND = 3


class CountingSource:
    """``batches`` entries of both namespaces (one each a batch), handed out only when asked for."""

    namespaces = (NS0, NS1)

    def __init__(self, batches: int):
        self.last_ts: Timestamp | None = None
        self.handed = 0  # batches the fanout has asked for
        self._batches = batches

    async def newest_ts(self) -> Timestamp | None:
        return None

    async def batches(self):
        for n in range(self._batches):
            self.handed += 1
            yield Batch([{"ts": Timestamp(1, n), "ns": NS0, "n": n}, {"ts": Timestamp(1, n), "ns": NS1, "n": n}])
        await asyncio.Event().wait()  # a source never ends


def numbers(events: list[OplogEvent]) -> list[int]:
    return [entry["n"] for event in events if isinstance(event, Batch) for entry in event.entries]


async def test_a_partition_that_does_not_read_holds_the_source_at_its_bound_and_nothing_is_lost(monkeypatch):
    monkeypatch.setattr(fanout_module, "VIEW_QUEUE_MAX", BOUND)
    source = CountingSource(batches=20)
    fanout = Fanout(source, (NS0, NS1))
    slow, fast = fanout.views[NS0], fanout.views[NS1]
    assert slow.queue.maxsize == fast.queue.maxsize == BOUND
    slow_batches, fast_batches = slow.batches(), fast.batches()
    slow_got: list[OplogEvent] = []
    fast_got: list[OplogEvent] = []

    async def read_fast() -> None:
        async for event in fast_batches:
            fast_got.append(event)

    # Partition 0's reader takes its first batch and then stops (its stream's own queue is full).
    first = asyncio.create_task(anext(slow_batches))
    reading, running = asyncio.create_task(read_fast()), asyncio.create_task(fanout.run())
    try:
        slow_got.append(await first)
        # The first went to the reader, BOUND wait in its queue, and the fanout holds the next one:
        # it asks the source for nothing more. (A fanout that went on would have asked for more by
        # the time its queue is seen full: both are read in one look.)
        await eventually(lambda: slow.queue.full() and source.handed == BOUND + 2, "the fanout waits at the bound")
        # partition 1 gets what the fanout took, then waits too: one source
        await eventually(lambda: numbers(fast_got) == list(range(BOUND + 1)), "partition 1 has what was taken")
        assert source.handed == BOUND + 2 and slow.queue.qsize() == BOUND
        # Partition 0 reads again: the fanout resumes, and both get every entry once, in order.
        async for event in slow_batches:
            slow_got.append(event)
            assert slow.queue.qsize() <= BOUND
            if numbers(slow_got)[-1] == 19:
                break
        await eventually(lambda: numbers(fast_got)[-1:] == [19], "partition 1 gets the rest")
        assert numbers(slow_got) == numbers(fast_got) == list(range(20)) and source.handed == 20
        assert not running.done()
    finally:
        for task in (reading, running):
            task.cancel()
        await asyncio.gather(reading, running, return_exceptions=True)
        await slow_batches.aclose()
