"""Writes led per partition (CHAT_WRITER_LEADS) against real MariaDB and FerretDB.

Two hosts' writers side by side, each leading one partition. A copy owed to a
partition is made by that partition's leader, which watches its echoes; the
writer whose commit owes it never takes that partition's lock. Nothing else
drains the echoes here: the writers take no idle turn.
"""

import asyncio
import contextlib
import logging
from collections import Counter

import pytest
from sqlalchemy import create_engine, event, select
from sqlalchemy.exc import OperationalError

from chat.drafts import Draft
from chat.partitions import LiveMap, SlotMap
from harness.system import databases
from tests.e2e.helpers import partition_docs, partition_rows, user_in, writer_stores
from chat.signal_store import connect
from db.sql import echoes
from tests.timing import eventually
from writer import echo_sql
from writer.echo_wake import EchoWakes, listen_for_echo_wakes
from writer.echo_watch import EchoWatch
from writer.message_writer import MessageWriter
from writer.partitioned import PartitionedWriter

FOUR = SlotMap.even(4)
NO_IDLE_TURNS = 3600.0  # an idle turn drains echoes too: here only the watch may


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("leads"), partitions=4) as dbs:
        yield dbs


@contextlib.asynccontextmanager
async def running_host(dbs, name: str, led: frozenset[int], turns: Counter, watch_every: float = 0.01,
                       echoes_owed=lambda partition: None):
    """One host's writers of every partition, leading ``led``; each turn counted in ``turns[(name, partition)]``.
    ``watch_every``: its led partitions' echo watches' period; ``echoes_owed``: its commits' echo wakes."""
    async with writer_stores(dbs) as (engine, db):
        def make(partition, live, hand_over, reroute, adopted):
            def counted(waiting: float, holding: float) -> None:
                turns[name, partition] += 1
            return MessageWriter(engine, db, batch_max=50, window_ms=2, queue_max=100, timeout_seconds=5,
                                 retention_seconds=86_400, partition=partition, slot_map=live, hand_over=hand_over,
                                 reroute=reroute, adopted=adopted, observe_turn=counted,
                                 watch_echoes_every=watch_every if partition in led else None)

        host = PartitionedWriter(FOUR, make, led, echoes_owed)
        task = asyncio.create_task(host.run(repair_every=NO_IDLE_TURNS))
        try:
            yield host
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            host.close()


async def test_a_copy_is_made_by_its_partition_s_leader_and_the_sender_s_host_never_takes_that_lock(dbs):
    alice, bob = user_in(1, "alice", FOUR), user_in(2, "bob", FOUR)
    turns: Counter = Counter()
    async with running_host(dbs, "a", frozenset({1}), turns) as a, running_host(dbs, "b", frozenset({2}), turns):
        originals = [(await a.submit(Draft(alice, bob, f"led {i}", f"k{i}")))[0] for i in range(3)]
        copies = await eventually(lambda: asyncio.to_thread(
            lambda: len(rows := partition_rows(dbs, 2, "sender = :s", s=alice)) == 3 and rows),
            "the leader's copies")
        in_store = await eventually(lambda: asyncio.to_thread(
            lambda: len(found := partition_docs(dbs, 2, {"from": alice})) == 3 and found), "the copies in Mongo")
    assert [(r.origin_part, r.origin_id, r.body) for r in copies] == [(1, m.id, m.body) for m in originals]
    assert [d["_id"] for d in in_store] == [r.id for r in copies]
    # Host a committed the originals under partition 1's lock and never took partition 2's;
    # host b, partition 2's leader, made the copies and never took partition 1's.
    assert turns["a", 1] >= 1 and turns["b", 2] >= 1
    assert turns["a", 2] == 0 and turns["b", 1] == 0


async def test_the_owing_commit_wakes_the_leader_s_watch_through_redis(dbs, caplog):
    """The leader's watch would wait an hour; the wake its copy's original published brings the copy."""
    alice, bob = user_in(1, "alice", FOUR), user_in(2, "bob", FOUR)
    turns: Counter = Counter()
    publisher = connect(dbs.redis.url, 5)
    wakes = EchoWakes.on_redis(publisher)
    try:
        async with (running_host(dbs, "a", frozenset({1}), turns, echoes_owed=wakes.owed) as a,
                    running_host(dbs, "b", frozenset({2}), turns, watch_every=3600.0) as b):
            with caplog.at_level(logging.INFO, logger="chat.oplog"):
                listening = asyncio.create_task(listen_for_echo_wakes(dbs.redis.url, b.echoes_woken,
                                                                      connect_seconds=5))
                try:
                    await eventually(lambda: any("wake_listening channel=chat:echoes" in r.getMessage()
                                                 for r in caplog.records), "host b listens for echo wakes")
                    original, _ = await a.submit(Draft(alice, bob, "woken", "wk1"))
                    copies = await eventually(lambda: asyncio.to_thread(
                        lambda: partition_rows(dbs, 2, "sender = :s AND body = 'woken'", s=alice)), "the copy")
                finally:
                    listening.cancel()
                    await asyncio.gather(listening, return_exceptions=True)
        assert [(r.origin_part, r.origin_id) for r in copies] == [(1, original.id)]
        assert wakes.published >= 1 and wakes.failed == 0
        assert turns["b", 2] >= 1 and turns["a", 2] == 0  # made by partition 2's leader, host a never took its lock
    finally:
        await wakes.settled()
        await publisher.aclose()


class _Refusing:
    """The real engine, whose first ``refusals`` connects fail as a lost MySQL link does."""

    def __init__(self, engine, refusals: int):
        self._engine, self.refusals = engine, refusals

    def connect(self):
        if self.refusals:
            self.refusals -= 1
            raise OperationalError("connect", {}, Exception("(2003) can't connect to MySQL server"))
        return self._engine.connect()


async def test_a_watch_that_cannot_read_says_so_once_and_offers_what_is_owed_once_it_can(dbs, caplog):
    alice, bob = user_in(1, "alice", FOUR), user_in(2, "bob", FOUR)
    turns: Counter = Counter()
    # another host commits an original owed to partition 2; nothing here makes its copy
    async with running_host(dbs, "a", frozenset({1}), turns) as a:
        original, _ = await a.submit(Draft(alice, bob, "while the link was down", "w1"))
    offered: list = []
    reads = 0

    async def next_read(seconds: float) -> None:  # the watch's pause: counts reads, ends the watch after 5
        nonlocal reads
        reads += 1
        if reads > 5:
            raise asyncio.CancelledError

    async with writer_stores(dbs) as (engine, _db):
        watch = EchoWatch(_Refusing(engine, 3), partition=2, live=LiveMap(FOUR), offer=offered.append,
                          interval=0.05, limit=10, sleep=next_read)
        try:
            with caplog.at_level(logging.WARNING, logger="chat.writer"), pytest.raises(asyncio.CancelledError):
                await watch.run()
        finally:
            watch.close()
    events = [r.getMessage().split()[0] for r in caplog.records if "echo_watch" in r.getMessage()]
    assert events == ["event=echo_watch_failed", "event=echo_watch_resumed"]  # three failed reads, one line
    assert [copy.origin for copy in offered] == [(1, original.id)]  # offered once, though read twice since


async def test_a_watch_reads_the_echoes_of_every_partition_and_their_originals_in_one_statement(dbs):
    # Originals of partitions 1 and 2 owe copies to partition 3, whose leader is not running;
    # an echo whose original is gone (its table emptied by hand) is owed too.
    alice, bob, dave = user_in(1, "alice", FOUR), user_in(2, "bob", FOUR), user_in(3, "dave", FOUR)
    async with running_host(dbs, "a", frozenset({1, 2}), Counter()) as a:
        from_bob, _ = await a.submit(Draft(bob, dave, "from partition 2", "one-read-2"))
        from_alice, _ = await a.submit(Draft(alice, dave, "from partition 1", "one-read-1"))
    orphan = (1, 10**12)
    engine = create_engine(dbs.mariadb.url())
    try:
        with engine.begin() as conn:
            conn.execute(echoes.insert().values(to_part=3, from_part=orphan[0], from_id=orphan[1]))
        owed_before = {(e.from_part, e.from_id) for e in _echoes_to(engine, 3)}
        said: list[str] = []
        event.listen(engine, "before_cursor_execute", lambda _c, _cur, statement, *_: said.append(statement))
        offered: list = []

        async def one_read(seconds: float) -> None:  # the watch's pause: the second ends the watch
            if said:
                raise asyncio.CancelledError

        watch = EchoWatch(engine, partition=3, live=LiveMap(FOUR), offer=offered.append, interval=0.05,
                          limit=1000, sleep=one_read)
        watch.wake()  # the first read without a pause
        try:
            with pytest.raises(asyncio.CancelledError):
                await watch.run()
        finally:
            watch.close()
        assert len(said) == 1 and "UNION ALL" in said[0]
        # each original as stored, by the partition it came from, then its id: none for the orphan
        mine = [(copy.origin, copy.original.body) for copy in offered if copy.original.recipient == dave]
        assert mine == [((1, from_alice.id), "from partition 1"), ((2, from_bob.id), "from partition 2")]
        assert orphan not in {copy.origin for copy in offered}
        assert {copy.origin for copy in offered} == owed_before - {orphan}
        # A read stopped at its limit holds the oldest echoes, and says it is not all of them.
        with engine.connect() as conn:
            found, complete = echo_sql.owed_now(conn, 3, 1, FOUR)
        assert [copy.origin for copy in found] == [min(owed_before)] and complete is False
    finally:
        with engine.begin() as conn:
            conn.execute(echoes.delete().where(echoes.c.to_part == 3, echoes.c.from_part == orphan[0],
                                               echoes.c.from_id == orphan[1]))
        engine.dispose()


def _echoes_to(engine, partition: int) -> list:
    with engine.connect() as conn:
        return conn.execute(select(echoes).where(echoes.c.to_part == partition)).all()
