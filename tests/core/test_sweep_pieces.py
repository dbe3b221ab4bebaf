"""The retention sweep's pieces and its loop (db/retention.py), with a fake
fast store and a fake pause: no database. That FerretDB really refuses a
larger delete, and that the pieces get through it, is
tests/e2e/test_large_store.py's."""

import asyncio
from types import SimpleNamespace

import pytest

from chat.partitions import collection_name
from db import mongo, retention
from tests.timing import PATIENCE

FERRETDB_DELETE_MAX = 32_766  # FerretDB 1.24 (SQLite): one SQL variable per document deleted


class FakeStore:
    """`messages_p{k}` and `meta`, as the sweep uses them; every write it makes, in order."""

    def __init__(self, ids: range, partition: int = 0):
        self.ids = set(ids)
        self.partition = partition
        self.meta: dict[str, dict] = {}
        self.writes: list[tuple[str, int]] = []

    def __getitem__(self, name: str):
        return SimpleNamespace(find_one=self._find_one, update_one=self._update_one) if name == mongo.META \
            else SimpleNamespace(delete_many=self._delete_many(name))

    async def _find_one(self, query: dict):
        return self.meta.get(query["_id"])

    async def _update_one(self, query: dict, update: dict, upsert: bool = False):
        doc = self.meta.setdefault(query["_id"], {"floor": 0})
        doc["floor"] = max(doc["floor"], update["$max"]["floor"])
        self.writes.append(("floor", doc["floor"]))

    def _delete_many(self, name: str):
        async def delete_many(query: dict):
            assert name == collection_name(self.partition)
            gone = {i for i in self.ids if i <= query["_id"]["$lte"]}
            assert len(gone) <= FERRETDB_DELETE_MAX, "FerretDB refuses this delete"
            self.ids -= gone
            self.writes.append(("delete", query["_id"]["$lte"]))
            return SimpleNamespace(deleted_count=len(gone))

        return delete_many


class Inline:
    """db.threads.Threads, running each call in place."""

    async def run(self, fn, *args):
        return fn(*args)


def test_delete_steps_cover_the_expired_range_in_pieces():
    assert retention.delete_steps(0, 100_000, 25_000) == [25_000, 50_000, 75_000, 100_000]
    assert retention.delete_steps(10, 60_000, 25_000) == [25_010, 50_010, 60_000]
    assert retention.delete_steps(5, 6, 25_000) == [6]
    assert retention.delete_steps(7, 7, 25_000) == []


def test_a_piece_is_a_delete_ferretdb_accepts():
    assert retention.DELETE_PIECE <= FERRETDB_DELETE_MAX


@pytest.mark.parametrize("partition", [0, 2])
async def test_a_sweep_raises_the_floor_before_each_piece_it_deletes(monkeypatch, partition):
    # The floor first: a reader that finds it past its position knows messages
    # may be missing, so it must never be behind what is gone.
    store = FakeStore(range(1, 40_011), partition)
    monkeypatch.setattr(retention, "newest_expired_id", lambda engine, after, cutoff, part: 40_000)
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    deleted = await retention.sweep_once(store, None, Inline(), 86_400, partition=partition, pause=pause)
    assert deleted == 40_000 and store.ids == set(range(40_001, 40_011))
    assert store.writes == [("floor", 25_000), ("delete", 25_000), ("floor", 40_000), ("delete", 40_000)]
    assert store.meta == {mongo.retention_key(partition): {"floor": 40_000}}
    assert pauses == [retention.PIECE_PAUSE_SECONDS] * 2  # the oplog tails get the server back between pieces
    # the next sweep starts from the floor: nothing more expired, nothing touched
    monkeypatch.setattr(retention, "newest_expired_id", lambda engine, after, cutoff, part: after)
    assert await retention.sweep_once(store, None, Inline(), 86_400, partition=partition, pause=pause) == 0
    assert len(store.writes) == 4


async def test_the_sweeper_sweeps_every_partition_each_period_and_a_failure_waits_for_the_next(monkeypatch):
    from pymongo.errors import AutoReconnect

    swept: list[tuple[int, int]] = []  # (period, partition)
    periods: list[float] = []

    async def sweep_once(db, engine, threads, retention_seconds, partition=0):
        swept.append((len(periods), partition))
        if (len(periods), partition) == (0, 1):
            raise AutoReconnect("the fast store went away")
        return 0

    class Stop(Exception):
        pass

    async def sleep(seconds: float) -> None:
        periods.append(seconds)
        if len(periods) == 2:
            raise Stop

    monkeypatch.setattr(retention, "sweep_once", sweep_once)
    with pytest.raises(Stop):
        async with asyncio.timeout(PATIENCE):
            await retention.run_sweeper(None, None, None, 86_400, interval=30.0, partitions=lambda: 3, sleep=sleep)
    assert swept == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]  # partition 2 swept after 1 failed
    assert periods == [30.0, 30.0]
