"""Two API processes' writers share the MySQL writer lock (writer/message_writer.py).

Each writer here has its own engine, so its own MySQL connection, as a
separate process would. The databases are the test's own: the lock is
server-wide, and the shared system's API takes it every second to look for
an outbox. A writer whose clients keep it busy still hands the
lock over as soon as the other one queues for it, after the batch in hand:
the other's message is not held up behind a whole turn of someone else's.
"""

import asyncio
import uuid

import pytest
from sqlalchemy import text

from chat.drafts import Draft
from db import mongo
from db.sql import make_engine
from harness.system import databases
from tests.timing import PATIENCE, eventually
from writer.core import HANDOVER_CHECK_SECONDS, Timing
from writer.message_writer import MessageWriter
from writer.mysql_steps import LOCK_NAME, NEXT_LOCK_NAME


def _writer(dbs, batch_max: int = 50, **options) -> MessageWriter:
    settings = dbs.settings()
    engine = make_engine(settings.stores.mysql_url.get_secret_value(), 5)
    client = mongo.make_client(settings.stores.mongo_url.get_secret_value(), 5)
    return MessageWriter(engine, client[settings.stores.mongo_db], batch_max=batch_max, window_ms=2, queue_max=10_000,
                         timeout_seconds=5, retention_seconds=86_400, **options)


def _queued(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": NEXT_LOCK_NAME}).scalar() is not None


@pytest.fixture(scope="module")
def own_dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("handoff")) as d:
        yield d


@pytest.mark.parametrize("check_every", [0.0, HANDOVER_CHECK_SECONDS])
async def test_a_busy_writer_hands_the_lock_to_a_queued_one_after_the_batch_in_hand(own_dbs, check_every):
    # check_every: how often a commit asks whether another process is queued.
    # Every commit: the hand-over comes after the batch in hand. As deployed
    # (every 20 ms), after the batches committed in those 20 ms.
    busy, other = _writer(own_dbs, timing=Timing(handover_check_seconds=check_every)), _writer(own_dbs)
    tasks = [asyncio.create_task(busy.run()), asyncio.create_task(other.run())]
    tag = uuid.uuid4().hex[:8]
    busy_ids: list[int] = []
    stop = asyncio.Event()

    async def client(i: int) -> None:  # a closed loop, like ab -c 50 on one process
        while not stop.is_set():
            msg, _ = await busy.submit(Draft(f"b{tag}{i}", "r", "busy"))
            busy_ids.append(msg.id)

    clients = [asyncio.create_task(client(i)) for i in range(50)]
    try:
        await eventually(lambda: len(busy_ids) >= 500, "the busy writer in full swing")
        sending = asyncio.create_task(other.submit(Draft(f"o{tag}", "r", "other")))
        # Counted from the moment the other writer is queued for the lock (looked
        # at back to back, not every POLL_SECONDS: the count starts no later than needed).
        async with asyncio.timeout(PATIENCE):
            while not sending.done() and not await asyncio.to_thread(_queued, busy._sql.engine):
                pass
        before = max(busy_ids)
        msg, created = await asyncio.wait_for(sending, PATIENCE)
        assert created
        # Ids are given in commit order: the busy writer's messages numbered in
        # between were committed while the other one was queued. The batch being
        # written when it queued and, if it queued just after the busy one
        # looked, the next: at most 2 x 50. Without the hand-over, the busy
        # writer keeps the lock for its whole turn: 300 to 500 measured.
        overtaken = [i for i in busy_ids if before < i < msg.id]
        if not check_every:
            assert len(overtaken) <= 100, len(overtaken)
        # and the lock went back: the busy writer goes on after it
        n = len(busy_ids)
        await eventually(lambda: len(busy_ids) >= n + 100, "the busy writer going on")
        assert max(busy_ids) > msg.id
    finally:
        stop.set()
        await asyncio.gather(*clients, return_exceptions=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in (busy, other):
            w._sql.engine.dispose()
            await w._mongo.db.client.close()


async def test_two_busy_writers_insert_into_mongo_in_id_order(own_dbs, caplog):
    """Turns of two busy writers alternate, and `messages`, read in its
    natural (insertion) order, holds every id once, in order, with no turn
    taking another's insert for an outbox. A daemon that saw id N can
    therefore rely on every id below N being there."""
    writers = [_writer(own_dbs), _writer(own_dbs)]
    tasks = [asyncio.create_task(w.run()) for w in writers]
    tag = uuid.uuid4().hex[:8]
    written: list[int] = []

    async def client(w: MessageWriter, i: int) -> None:
        while len(written) < 3000:
            msg, _ = await w.submit(Draft(f"{tag}{i}", "r", "both busy"))
            written.append(msg.id)

    try:
        clients = asyncio.gather(*(client(w, i) for i, w in enumerate(writers * 40)))
        await asyncio.wait_for(clients, 4 * PATIENCE)
        # the last turns' inserts are done once a turn has recorded
        # mirrored_upto past the last id answered (at its end, or its checkpoint)
        engine = writers[0]._sql.engine

        def state() -> tuple[int, int]:
            with engine.connect() as conn:
                return tuple(conn.execute(text("SELECT last_id, mirrored_upto FROM stream_state")).one())

        async def recorded() -> tuple[int, int] | None:
            last_and_mirrored = await asyncio.to_thread(state)
            return last_and_mirrored if last_and_mirrored[1] >= max(written) else None

        last, mirrored = await eventually(recorded, "mirrored_upto recorded past the last id answered")
        coll = writers[0]._mongo.db[mongo.MESSAGES]
        natural = [d["_id"] async for d in coll.find({"body": "both busy"}, {"_id": 1})]
        mine = sorted(written)
        assert natural == mine, "Mongo holds the ids out of order or not each once"
        assert mine == list(range(mine[0], mine[0] + len(mine)))  # gap-free
        assert mirrored == last
        # A turn repairs an outbox only where a turn before it handed the lock
        # over with an insert still in flight (past HANDOVER_GRACE_SECONDS, which a
        # loaded machine can reach; the repair's own insert may be left so too):
        # never by taking another's insert as lost. Read in log order, each repair
        # follows a hand-over not yet repaired; the first turn may also repair what
        # the last test's cancelled writers left.
        left, unexplained = 0, []
        for message in (r.getMessage() for r in caplog.records):
            if "event=mongo_left_in_flight" in message:
                left += 1
            elif "event=outbox_repair" in message:
                if left:
                    left -= 1
                else:
                    unexplained.append(message)
        assert len(unexplained) <= 1, unexplained
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in writers:
            w._sql.engine.dispose()
            await w._mongo.db.client.close()


@pytest.mark.parametrize(("batch_max", "queued", "commits"), [(50, 3, [4]), (3, 4, [3, 2])])
async def test_requests_that_queue_while_the_writer_waits_for_the_lock_join_its_first_commit(
        own_dbs, batch_max, queued, commits):
    # Another host's writer holds the lock. What reaches this writer while it waits
    # for it is committed with the batch it waits with, not in its next turn, up to
    # batch_max: the rest is the next commit's.
    batches: list[int] = []
    writer = _writer(own_dbs, batch_max, observe_batch=lambda n, _seconds: batches.append(n))
    other = make_engine(own_dbs.settings().stores.mysql_url.get_secret_value(), 1)
    running = asyncio.create_task(writer.run())
    tag = uuid.uuid4().hex[:8]
    try:
        with other.connect() as holder:
            assert holder.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": LOCK_NAME}).scalar() == 1
            first = asyncio.create_task(writer.submit(Draft(f"a{tag}", "r", "first")))
            await eventually(lambda: asyncio.to_thread(_queued, other), "the writer queued for the lock")
            later = [writer.enqueue(Draft(f"b{tag}{i}", "r", "while it waited")) for i in range(queued)]
            holder.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": LOCK_NAME})
            stored = [await asyncio.wait_for(task, PATIENCE) for task in [first, *later]]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        writer.close()
        other.dispose()
    ids = [msg.id for msg, created in stored if created]
    assert len(ids) == queued + 1 and ids == list(range(ids[0], ids[0] + queued + 1))  # in the order they came
    assert batches == commits
