"""A move whose fast store does not take a page in time: the mover sends that partition no more
pages (each would go twice: the writer's repair copies from the first one left), cuts over all the
same, and the target's writer copies the moved history into the fast store by itself."""

import uuid

import pymongo
import pytest
from sqlalchemy import create_engine, text

from chat.moves import MovePlan
from chat.partitions import SlotMap, collection_name, suffix
from db.mover import Mover, begin
from harness.servers import free_port
from harness.system import databases, running_system
from tests.e2e.helpers import post
from tests.e2e.test_online_move import chatctl, users_moving
from tests.timing import eventually

TWO, FOUR = SlotMap.even(2), SlotMap.even(2).grown(4)


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("move-away"), partitions=2) as dbs, \
            running_system(dbs, daemons=0, apis=1, writer=True, CHAT_RATE_LIMIT_PER_SECOND="0") as system:
        yield system


async def test_a_target_whose_fast_store_timed_out_gets_no_more_pages_and_its_writer_copies_them(system):
    tag = uuid.uuid4().hex[:6]
    stayer = users_moving(0, 0, 1, tag)[0]
    to1, to3 = users_moving(0, 1, 2, tag), users_moving(1, 3, 2, tag)  # partition 1: a source and a target
    movers = to1 + to3
    for m in movers:
        for i in range(6):
            assert (await post(system, m, stayer, f"{m} {i}")).status_code == 201
    prepared = chatctl(system, "prepare", "4")
    _, err = prepared.communicate()
    assert prepared.returncode == 0, err

    engine = create_engine(system.dbs.mariadb.url())
    lines: list[str] = []
    # nothing listens there: every insert into the fast store fails within the mover's bound
    mover = Mover(engine, f"mongodb://127.0.0.1:{free_port()}/?directConnection=true", "chat", 86_400, 2.0,
                  lines.append, page=4)
    try:
        assert mover.run(begin(engine, MovePlan(TWO, FOUR))) == FOUR
    finally:
        mover.close()
    stopped = sorted(line.split()[1].removesuffix("'s") for line in lines if "did not take a page" in line)
    assert stopped == ["1", "3"], lines  # each target once, though each got several pages
    assert sum(1 for line in lines if line.startswith("copied partition")) > 2 * len(stopped), lines

    moved = {1: to1, 3: to3}

    def moved_ids(partition: int) -> list[int]:
        with engine.connect() as conn:
            return list(conn.execute(text(f"SELECT id FROM messages{suffix(partition)} WHERE sender IN :u"),
                                     {"u": tuple(moved[partition])}).scalars())

    assert [len(moved_ids(k)) for k in (1, 3)] == [12, 12]  # each mover's whole history, in their new partition
    client = pymongo.MongoClient(system.dbs.ferretdb.url)
    try:
        def in_fast_store(partition: int) -> bool:
            ids = moved_ids(partition)
            found = client["chat"][collection_name(partition)].find({"_id": {"$in": ids}}, {"_id": 1})
            return {d["_id"] for d in found} == set(ids)

        for k in (1, 3):  # the writer adopts the map on its own, and repairs the new partitions' outbox
            await eventually(lambda k=k: in_fast_store(k), f"the moved rows of partition {k} in its collection")
    finally:
        client.close()
        engine.dispose()
