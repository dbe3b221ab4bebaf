"""`chatctl partitions show` and `grow`, as an operator runs them, against real MariaDB and FerretDB.

The commands run in this process (typer's runner: their exit status, stdout
and stderr); `python -m chatctl.cli partitions grow` as a process of its own
is in test_partition_epoch.py."""

import os
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pymongo
import pytest
from sqlalchemy import create_engine, inspect, text
from typer.testing import CliRunner

from chat.partitions import SlotMap, lock_name
from chatctl.cli import app
from harness.servers import env_for
from harness.system import databases
from harness.waiting import eventually_sync


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("grow")) as dbs:  # laid out with one partition, the default
        yield dbs


def chatctl(dbs, *args: str) -> SimpleNamespace:
    # As a process started with env_for would see it: its CHAT_ settings and no other.
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("CHAT_")}
    env |= {k: v for k, v in env_for(dbs.mariadb, dbs.ferretdb).items() if k.startswith("CHAT_")}
    done = CliRunner().invoke(app, ["partitions", *args], env=env, catch_exceptions=False)
    return SimpleNamespace(returncode=done.exit_code, stdout=done.stdout, stderr=done.stderr)


def test_grow_queues_behind_a_writer_mid_turn_then_grows_tables_collections_and_map(one):
    shown = chatctl(one, "show")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["epoch 0, 1 partition", "partition 0: 1024 slots 0-1023"]

    engine = create_engine(one.mariadb.url())
    try:
        with engine.connect() as writer:  # a writer of partition 0, mid-turn
            assert writer.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": lock_name(0)}).scalar() == 1
            with ThreadPoolExecutor(1) as pool:
                growing = pool.submit(chatctl, one, "grow", "3")

                def queued() -> bool:  # as a writer queues: the holder sees it and ends its turn
                    with engine.connect() as conn:
                        return conn.execute(text("SELECT IS_USED_LOCK(:n)"),
                                            {"n": lock_name(0) + ".next"}).scalar() is not None

                eventually_sync(queued, "the mover queued for partition 0's writer lock")
                assert SlotMap.decode(writer.execute(text("SELECT slot_map FROM partition_map WHERE id = 1"))
                                      .scalar()) == SlotMap.even(1)  # nothing cut over while the turn lasts
                writer.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": lock_name(0)})
                grown = growing.result()
        assert grown.returncode == 0, grown.stderr
        assert "epoch 1, 3 partitions" in grown.stdout.splitlines()
        with engine.connect() as conn:
            stored = SlotMap.decode(conn.execute(text("SELECT slot_map FROM partition_map WHERE id = 1")).scalar())
            states = [conn.execute(text(f"SELECT last_id FROM stream_state_p{k}")).all() for k in (1, 2)]
        assert stored == SlotMap.even(1).grown(3)
        assert states == [[(0,)], [(0,)]]
        assert {"messages_p1", "messages_p2"} <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    client = pymongo.MongoClient(one.ferretdb.url)
    try:
        assert {"messages_p1", "messages_p2"} <= set(client["chat"].list_collection_names())
    finally:
        client.close()

    again = chatctl(one, "grow", "2")
    assert again.returncode == 1 and "never shrink" in again.stderr


@pytest.mark.parametrize("args, said", [
    (["move", "0-2000", "--to", "1"], "slots are 0..1023"),
    (["move", "a-b", "--to", "1"], "slots are numbers or ranges"),
    (["move", "0-9", "--to", "99"], "partition 99 is not one of 0.."),
    (["move", "0-9", "--to", "0"], "in partition 0 already"),
    (["resume"], "no move is in progress"),
])
def test_a_move_that_cannot_be_done_is_refused_with_what_is_wrong(one, args, said):
    done = chatctl(one, *args)
    assert done.returncode == 1 and said in done.stderr, done.stderr
