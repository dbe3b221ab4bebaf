"""A turn's committed messages on their way to Mongo (writer/mirror.py ``Mirror``),
with a fake insert, clock and pause: no database.

Each insert of the fake waits until the test settles it (True: stored, False:
failed, as the writer's insert reports a Mongo error or its deadline), so the
test decides when Mongo answers, and sees what each insert carried.
"""

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

from chat.messages import Message
from tests.timing import PATIENCE
from writer.core import INSERT_GAP_BELOW, INSERT_GAP_SECONDS, UNSENT_BATCHES, unsent_max
from writer.mirror import Mirror

AT = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Insert:
    ids: list[int]
    outcome: asyncio.Future  # what the insert returns once the test settles it


@dataclass
class FakeMongo:
    inserted: list[list[int]] = field(default_factory=list)  # each insert that succeeded, in order
    log: list[str] = field(default_factory=list)  # inserts' starts and ends, and the turn's commits
    started: asyncio.Queue = field(default_factory=asyncio.Queue)

    async def insert(self, docs: list[dict]) -> bool:
        call = Insert([d["_id"] for d in docs], asyncio.get_running_loop().create_future())
        self.log.append(f"insert {call.ids} started")
        self.started.put_nowait(call)
        ok = await call.outcome
        self.log.append(f"insert {call.ids} ended")
        if ok:
            self.inserted.append(call.ids)
        return ok

    async def next_insert(self) -> Insert:
        async with asyncio.timeout(PATIENCE):
            return await self.started.get()


@dataclass
class Clock:
    now: float = 100.0
    pauses: list[float] = field(default_factory=list)

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)


def mirror_of(mongo: FakeMongo, clock: Clock | None = None, *, ok: bool = True, mirrored: int = 0,
              bound: int = 1000, lags: list | None = None) -> Mirror:
    clock = clock or Clock()
    return Mirror(mongo.insert, ok, mirrored, mirrored, bound,
                  (lambda s, n: lags.extend([s] * n)) if lags is not None else (lambda s, n: None),
                  clock=lambda: clock.now, sleep=clock.sleep)


def msgs(*ids: int) -> list[Message]:
    return [Message(i, "alice", "bob", f"m{i}", AT) for i in ids]


async def commit(mirror: Mirror, *ids: int, stamped: float = 100.0) -> None:
    """A batch committed and handed on; a commit that does not wait for Mongo returns at once."""
    async with asyncio.timeout(PATIENCE):
        await mirror.add(msgs(*ids), ids[-1], stamped)


async def drained(mirror: Mirror) -> None:
    async with asyncio.timeout(PATIENCE):
        await mirror.drain()


async def test_ids_reach_mongo_once_each_in_id_order_each_insert_taking_all_committed_meanwhile():
    mongo = FakeMongo()
    mirror = mirror_of(mongo)
    await commit(mirror, 1, 2)
    first = await mongo.next_insert()
    assert first.ids == [1, 2]
    await commit(mirror, 3)  # answered while the insert runs: the commit did not wait for it
    await commit(mirror, 4, 5)
    assert mirror.mirrored == 0  # nothing is known to be in Mongo yet
    first.outcome.set_result(True)
    second = await mongo.next_insert()
    assert second.ids == [3, 4, 5] and mirror.mirrored == 2
    second.outcome.set_result(True)
    await drained(mirror)
    assert mongo.inserted == [[1, 2], [3, 4, 5]]
    assert (mirror.ok, mirror.mirrored, mirror.inserting) == (True, 5, None)


async def test_the_next_insert_starts_when_the_last_one_ends_not_when_the_turn_gets_to_it():
    # The turn may be in a long MySQL commit when an insert ends; the
    # next insert must not wait for the turn to come back to the mirror.
    mongo = FakeMongo()
    mirror = mirror_of(mongo)
    await commit(mirror, 1)
    first = await mongo.next_insert()
    await commit(mirror, 2)
    await commit(mirror, 3)
    # From here the turn does not call the mirror again (it is in its next commit).
    first.outcome.set_result(True)
    second = await mongo.next_insert()
    assert second.ids == [2, 3]
    second.outcome.set_result(True)
    await drained(mirror)


async def test_commits_wait_for_the_insert_in_flight_once_the_unsent_messages_reach_the_bound():
    # batch_max 2: at most UNSENT_BATCHES * 2 committed messages wait for
    # Mongo; the commit that reaches that bound waits until the pump takes them.
    bound = unsent_max(2)
    assert bound == UNSENT_BATCHES * 2
    mongo = FakeMongo()
    mirror = mirror_of(mongo, bound=bound)
    batches = [list(range(i, i + 2)) for i in range(1, 2 * (UNSENT_BATCHES + 2), 2)]
    reaching = batches[UNSENT_BATCHES]  # the batch after the one in flight and UNSENT_BATCHES - 1 more
    about_to_reach = asyncio.Event()

    async def commits() -> None:  # the turn's next commits, while the first insert runs
        for batch in batches[1:]:
            if batch is reaching:
                about_to_reach.set()
            await mirror.add(msgs(*batch), batch[-1], 100.0)
            mongo.log.append(f"committed {batch}")

    await commit(mirror, *batches[0])
    first = await mongo.next_insert()
    assert first.ids == batches[0]
    turn = asyncio.create_task(commits())
    async with asyncio.timeout(PATIENCE):
        await about_to_reach.wait()  # the turn ran until it waits (or, were it unbounded, past it)
    committed = [line for line in mongo.log if line.startswith("committed")]
    assert committed == [f"committed {b}" for b in batches[1:UNSENT_BATCHES]]  # and the one in flight
    first.outcome.set_result(True)
    second = await mongo.next_insert()  # the pump takes the bound's worth: room for the waiting commit
    assert second.ids == [i for b in batches[1:UNSENT_BATCHES + 1] for i in b]
    second.outcome.set_result(True)
    third = await mongo.next_insert()
    third.outcome.set_result(True)
    async with asyncio.timeout(PATIENCE):
        await turn
    log = mongo.log
    assert log.index(f"insert {first.ids} ended") < log.index(f"committed {reaching}")
    await drained(mirror)
    assert [i for ids in mongo.inserted for i in ids] == [i for b in batches for i in b]


async def test_a_failed_insert_ends_the_mirroring_and_what_is_unsent_becomes_the_outbox():
    mongo = FakeMongo()
    mirror = mirror_of(mongo, mirrored=10)
    await commit(mirror, 11, 12)
    first = await mongo.next_insert()
    await commit(mirror, 13)
    await commit(mirror, 14)
    first.outcome.set_result(False)
    await drained(mirror)
    assert not mirror.ok and mirror.mirrored == 10  # the outbox: 11-14, copied in order by a later turn
    await commit(mirror, 15)  # later commits of the turn go to MySQL only
    await drained(mirror)
    assert mongo.started.empty() and mongo.inserted == []
    assert (mirror.ok, mirror.mirrored) == (False, 10)


async def test_a_hung_insert_holds_commits_only_at_the_bound_and_its_failure_releases_them():
    # The writer's insert gives up at its deadline and reports a failure:
    # the commit waiting for room goes on, and the turn sends Mongo nothing more.
    mongo = FakeMongo()
    mirror = mirror_of(mongo, bound=4)
    about_to_reach = asyncio.Event()

    async def commits() -> None:  # the turn's next commits, while the first insert hangs
        for batch in ([2, 3], [4, 5]):
            if batch == [4, 5]:
                about_to_reach.set()
            await mirror.add(msgs(*batch), batch[-1], 100.0)
            mongo.log.append(f"committed {batch}")

    await commit(mirror, 1)
    hung = await mongo.next_insert()
    turn = asyncio.create_task(commits())
    async with asyncio.timeout(PATIENCE):
        await about_to_reach.wait()
    assert mongo.log[-1] == "committed [2, 3]" and not turn.done()  # [4, 5] makes 4 unsent: it waits
    hung.outcome.set_result(False)  # the deadline
    async with asyncio.timeout(PATIENCE):
        await turn
    await drained(mirror)
    assert mongo.log[-1] == "committed [4, 5]" and mongo.started.empty()
    assert (mirror.ok, mirror.mirrored) == (False, 0)


async def test_a_turn_that_starts_behind_mongo_sends_it_nothing():
    # OUTBOX from the start (the repair was left for later): commits go on, Mongo is left alone.
    mongo = FakeMongo()
    mirror = mirror_of(mongo, ok=False, mirrored=3)
    for i in range(4, 20):
        await commit(mirror, i)
    await drained(mirror)
    assert mongo.started.empty() and (mirror.ok, mirror.mirrored) == (False, 3)


async def test_with_nothing_new_or_in_flight_mongo_holds_everything_committed():
    mongo = FakeMongo()
    mirror = mirror_of(mongo, mirrored=7)
    await mirror.add([], 7, 100.0)  # a batch of retries only: nothing new committed
    await drained(mirror)
    assert mongo.started.empty() and mirror.mirrored == 7
    await commit(mirror, 8)
    (await mongo.next_insert()).outcome.set_result(True)
    await drained(mirror)
    assert mirror.mirrored == 8


async def test_each_message_s_wait_for_mongo_is_observed_once_from_its_commit_stamp():
    # chat_writer_mongo_lag_seconds: what the writer adds to a delivery, one
    # observation per message, from its created_at stamp to the end of the
    # insert that holds it; a message held back by Mongo is measured in full.
    mongo, clock, lags = FakeMongo(), Clock(), []
    mirror = mirror_of(mongo, clock, lags=lags)
    await commit(mirror, 1, 2, stamped=100.0)
    first = await mongo.next_insert()
    await commit(mirror, 3, 4, 5, stamped=100.1)
    clock.now = 100.5
    assert lags == []  # nothing is in Mongo yet
    first.outcome.set_result(True)
    second = await mongo.next_insert()
    assert lags == [0.5, 0.5]
    clock.now = 101.1
    second.outcome.set_result(True)
    await drained(mirror)
    assert lags == [0.5, 0.5, 1.0, 1.0, 1.0]


async def test_a_failed_insert_observes_no_wait_for_its_messages():
    mongo, lags = FakeMongo(), []
    mirror = mirror_of(mongo, lags=lags)
    await commit(mirror, 1, 2)
    (await mongo.next_insert()).outcome.set_result(False)
    await drained(mirror)
    assert lags == []  # not in Mongo: the outbox's gauges speak for them


async def test_an_insert_is_followed_by_a_pause_unless_a_flood_of_messages_waits():
    mongo, clock = FakeMongo(), Clock()
    mirror = mirror_of(mongo, clock)
    await commit(mirror, 1)
    first = await mongo.next_insert()
    await commit(mirror, *range(2, 2 + INSERT_GAP_BELOW))  # a flood waits behind the insert
    first.outcome.set_result(True)
    second = await mongo.next_insert()
    assert clock.pauses == []  # the flood goes at once
    await commit(mirror, 100)
    second.outcome.set_result(True)
    third = await mongo.next_insert()
    assert clock.pauses == [INSERT_GAP_SECONDS]  # one message waited: a pause first
    third.outcome.set_result(True)
    await drained(mirror)
    assert [len(ids) for ids in mongo.inserted] == [1, INSERT_GAP_BELOW, 1]
