"""The 24 h fast store on FerretDB: no TTL index there, so the API's sweeper
deletes expired messages (MySQL keeps them), records the retention floor, and
a client whose resume point is older hears `recovered: false`. The TTL-index
path needs a real MongoDB and is not shown here.

A message is made older than the retention by moving its `created_at` back
in MySQL, which is what the sweep reads: no test waits for time to pass, and
the messages that must stay are never near their own expiry."""

from datetime import UTC, timedelta

import pytest
from sqlalchemy import create_engine, text

from db.init import init_all
from tests.e2e.helpers import connect, mongo_docs, mongo_docs_soon, mysql_rows, nothing_more, post, receive
from harness.system import System, private_system
from tests.timing import eventually

RETENTION_SECONDS = 3600


@pytest.fixture(scope="module")
def swept_system(tmp_path_factory):
    # No recent cache: a catch-up reads the store, whose retention floor the sweep
    # raises. A message is aged here in MySQL only, so the copy a daemon's cache
    # took when it was new would still say it is new: a state that time passing
    # cannot make, and that made the resume's answer depend on what the cache held.
    with private_system(tmp_path_factory.mktemp("retention"), CHAT_RETENTION_SECONDS=RETENTION_SECONDS,
                        CHAT_SWEEP_INTERVAL_SECONDS=0.5, CHAT_RATE_LIMIT_PER_SECOND=0,
                        CHAT_RECENT_CACHE_MAX=0) as system:
        yield system


def set_created_at(system: System, created: dict[int, str]) -> None:
    """Moves messages' `created_at` in MySQL: {id: an SQL expression of the new time}."""
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.begin() as conn:
            for msg_id, when in created.items():
                conn.execute(text(f"UPDATE messages SET created_at = {when} WHERE id = :id"), {"id": msg_id})
    finally:
        engine.dispose()


def test_on_ferretdb_messages_has_no_index_but_its_id_so_the_sweeper_path_is_used(swept_system):
    # FerretDB has no TTL indexes and scans for every query of ours: db.mongo
    # creates none there (they would only slow its inserts), and drops those an
    # older version made. MongoDB gets to_id, from_id and the TTL index.
    import pymongo
    client = pymongo.MongoClient(swept_system.dbs.ferretdb.url)
    try:
        messages = client["chat"]["messages"]
        assert [i["name"] for i in messages.list_indexes()] == ["_id_"]
        messages.create_index("created_at", name="created_at")  # as an older schema made it
        init_all(swept_system.dbs.settings())
        assert [i["name"] for i in messages.list_indexes()] == ["_id_"]
    finally:
        client.close()


async def test_expired_messages_are_swept_from_mongo_kept_in_mysql_and_resume_says_not_recovered(swept_system, users):
    alice, bob = users("alice"), users("bob")
    old = (await post(swept_system, alice, bob, "old")).json()
    set_created_at(swept_system, {int(old["id"]): f"created_at - INTERVAL {RETENTION_SECONDS + 60} SECOND"})
    fresh = (await post(swept_system, alice, bob, "fresh")).json()
    swept = f"event=retention_sweep partition=0 deleted=1 floor={old['id']}"
    await eventually(lambda: swept in (swept_system.logdir / "api_0.log").read_text(), "the sweep of the old message")
    assert mongo_docs(swept_system, {"_id": int(old["id"])}) == []
    assert [d["body"] for d in await mongo_docs_soon(swept_system, {"from": alice}, 1)] == ["fresh"]
    assert [r.body for r in mysql_rows(swept_system, "sender = :s", s=alice)] == ["old", "fresh"]

    # resuming from before the expired message: not recovered, and no silent partial fill
    # is claimed, though what is retained is still sent
    ws, hello = await connect(swept_system, bob, since=str(int(old["id"]) - 1))
    assert hello["recovered"] is False
    assert [f["body"] for f in await receive(ws, 1)] == ["fresh"]
    assert await nothing_more(swept_system, ws, bob) == []
    await ws.close()
    # resuming from the expired message itself: everything after it is retained
    ws, hello = await connect(swept_system, bob, since=old["id"])
    assert hello["recovered"] is True
    assert [f["id"] for f in await receive(ws, 1)] == [fresh["id"]]
    await ws.close()


async def test_what_has_expired_is_read_from_mysql_by_key_page_by_page(swept_system, users, monkeypatch):
    # The sweep asks MySQL, not FerretDB (which would decode all of `messages`
    # for any question): the highest expired id, walking up from the floor.
    from db import retention
    from db.sql import make_engine

    alice, bob = users("alice"), users("bob")
    posted = [int((await post(swept_system, alice, bob, f"m{i}")).json()["id"]) for i in range(5)]
    # each its own created_at, a second apart in id order (two posts may fall in one millisecond)
    set_created_at(swept_system, {msg_id: f"TIMESTAMP '2030-01-01 00:00:00' + INTERVAL {i} SECOND"
                                 for i, msg_id in enumerate(posted)})
    rows = mysql_rows(swept_system, "sender = :s", s=alice)
    assert [r.id for r in rows] == posted
    monkeypatch.setattr(retention, "PAGE", 2)  # the walk crosses a page boundary
    engine = make_engine(swept_system.dbs.mariadb.url(), 2)
    try:
        at = rows[3].created_at.replace(tzinfo=UTC)  # rows 0-2 are older than this
        assert retention.newest_expired_id(engine, posted[0] - 1, at) == posted[2]
        assert retention.newest_expired_id(engine, posted[2], at) == posted[2]  # nothing new since
        assert retention.newest_expired_id(engine, posted[0] - 1, at - timedelta(days=1)) == posted[0] - 1
    finally:
        engine.dispose()
