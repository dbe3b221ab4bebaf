"""The 24 h fast store on FerretDB: no TTL index there, so the API's sweeper
deletes expired messages (MySQL keeps them), records the retention floor, and
a client whose resume point is older hears `recovered: false`. The TTL-index
path needs a real MongoDB and is not shown here."""

import asyncio
import time
from datetime import UTC

import pytest

from db.init import init_all
from tests.e2e.helpers import connect, mongo_docs, mongo_docs_soon, mysql_rows, nothing_more, post, receive
from tests.system import private_system


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory):
    with private_system(tmp_path_factory.mktemp("retention"), CHAT_RETENTION_SECONDS=3,
                        CHAT_SWEEP_INTERVAL_SECONDS=0.5, CHAT_RATE_LIMIT_PER_SECOND=0) as system:
        yield system


def test_on_ferretdb_messages_has_no_index_but_its_id_so_the_sweeper_path_is_used(short_lived):
    # FerretDB has no TTL indexes and scans for every query of ours: db.mongo
    # creates none there (they would only slow its inserts), and drops those an
    # older version made. MongoDB gets to_id, from_id and the TTL index.
    import pymongo
    client = pymongo.MongoClient(short_lived.dbs.ferretdb.url)
    try:
        messages = client["chat"]["messages"]
        assert [i["name"] for i in messages.list_indexes()] == ["_id_"]
        messages.create_index("created_at", name="created_at")  # as an older schema made it
        init_all(short_lived.dbs.settings())
        assert [i["name"] for i in messages.list_indexes()] == ["_id_"]
    finally:
        client.close()


async def test_expired_messages_are_swept_from_mongo_kept_in_mysql_and_resume_says_not_recovered(short_lived, users):
    alice, bob = users("alice"), users("bob")
    old = (await post(short_lived, alice, bob, "old")).json()
    await asyncio.sleep(3.5)
    fresh = (await post(short_lived, alice, bob, "fresh")).json()
    deadline = time.monotonic() + 5
    while mongo_docs(short_lived, {"_id": int(old["id"])}):
        assert time.monotonic() < deadline, "the sweeper did not delete the expired message"
        await asyncio.sleep(0.2)
    assert [d["body"] for d in await mongo_docs_soon(short_lived, {"from": alice}, 1)] == ["fresh"]
    assert [r.body for r in mysql_rows(short_lived, "sender = :s", s=alice)] == ["old", "fresh"]

    # resuming from before the expired message: not recovered, and no silent partial fill
    # is claimed, though what is retained is still sent
    ws, hello = await connect(short_lived, bob, since=str(int(old["id"]) - 1))
    assert hello["recovered"] is False
    assert [f["body"] for f in await receive(ws, 1)] == ["fresh"]
    assert await nothing_more(ws)
    await ws.close()
    # resuming from the expired message itself: everything after it is retained
    ws, hello = await connect(short_lived, bob, since=old["id"])
    assert hello["recovered"] is True
    assert [f["id"] for f in await receive(ws, 1)] == [fresh["id"]]
    await ws.close()


async def test_what_has_expired_is_read_from_mysql_by_key_page_by_page(short_lived, users, monkeypatch):
    # The sweep asks MySQL, not FerretDB (which would decode all of `messages`
    # for any question): the highest expired id, walking up from the floor.
    from datetime import timedelta

    from db import retention
    from db.sql import make_engine

    alice, bob = users("alice"), users("bob")
    posted = []
    for i in range(5):
        posted.append(int((await post(short_lived, alice, bob, f"m{i}")).json()["id"]))
        await asyncio.sleep(0.01)  # each its own created_at (ms)
    rows = mysql_rows(short_lived, "sender = :s", s=alice)
    assert [r.id for r in rows] == posted
    monkeypatch.setattr(retention, "PAGE", 2)  # the walk crosses a page boundary
    engine = make_engine(short_lived.dbs.mariadb.url(), 2)
    try:
        at = rows[3].created_at.replace(tzinfo=UTC)  # rows 0-2 are older than this
        assert retention.newest_expired_id(engine, posted[0] - 1, at) == posted[2]
        assert retention.newest_expired_id(engine, posted[2], at) == posted[2]  # nothing new since
        assert retention.newest_expired_id(engine, posted[0] - 1, at - timedelta(days=1)) == posted[0] - 1
    finally:
        engine.dispose()
