"""A move whose fast store does not take a page in time: the mover sends that partition no more
pages (each would go twice: the writer's repair copies from the first one left), cuts over all the
same, and the target's writer copies the moved history into the fast store by itself."""

import re
import signal
import uuid

import pymongo
import pytest
from sqlalchemy import create_engine, text

from chat.moves import MovePlan
from chat.partitions import SlotMap, collection_name, suffix
from chat.settings import Settings, StoresSettings
from chatctl.partitions import STORE_ATTEMPTS, ChangeRefused, move
from db.mover import Mover, begin
from db.partition_map import read_slot_map
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


def slot_map(system) -> SlotMap:
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            found = read_slot_map(conn)
    finally:
        engine.dispose()
    assert found is not None
    return found


def test_a_move_waits_for_a_fast_store_that_does_not_answer_and_goes_on_once_it_does(system):
    before = slot_map(system)
    slot = before.slots_of(1)[0]
    ferretdb = system.dbs.ferretdb.proc
    lines: list[str] = []

    def report(line: str) -> None:
        lines.append(line)
        if line.startswith("the fast store did not make"):
            ferretdb.send_signal(signal.SIGCONT)  # the store answers again: the next attempt goes on

    ferretdb.send_signal(signal.SIGSTOP)  # frozen, as an overloaded store that answers nothing
    try:
        described = move(system.dbs.settings(), [slot], 0, report, store_wait=1.0)
    finally:
        ferretdb.send_signal(signal.SIGCONT)
    waited = [line for line in lines if line.startswith("the fast store did not make")]
    # the error is the server selection's or the socket's, as far as the handshake got before the freeze
    assert [re.sub(r"\((\w+);", "(error;", line) for line in waited] == [
        f"the fast store did not make the partitions' collections within 1 s (error; attempt 1 of {STORE_ATTEMPTS})"
    ], lines
    after = slot_map(system)
    assert described.splitlines()[0].startswith(f"epoch {before.epoch + 1},")
    assert (after.epoch, after.owner[slot]) == (before.epoch + 1, 0)


def test_a_move_whose_fast_store_never_answers_is_refused_with_nothing_moved(system):
    before = slot_map(system)
    lines: list[str] = []
    away = Settings(stores=StoresSettings(mysql_url=system.dbs.mariadb.url(),
                                          mongo_url=f"mongodb://127.0.0.1:{free_port()}/?directConnection=true"))
    with pytest.raises(ChangeRefused, match="answered none of .* nothing has moved"):
        move(away, [before.slots_of(1)[0]], 0, lines.append, store_wait=0.5)
    assert len([line for line in lines if line.startswith("the fast store did not make")]) == STORE_ATTEMPTS
    assert slot_map(system) == before
