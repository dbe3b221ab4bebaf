"""A catch-up read from the store gets what MySQL has committed and the fast
store does not hold yet, as deployed: writer process, relay, one daemon.

The message is an outbox: committed to MySQL by a writer that stopped before
it copied it to `messages` (the writer process here is frozen, so that no
repair copies it meanwhile). The daemon's gap check reads it from MySQL and
releases it: the sender's open socket gets it live, and the stream's position
is past it. A new socket of its recipient then resumes from before it with a
catch-up the recent cache cannot serve: routed by user, because the user's
first socket on this daemon has a ``since`` older than where the relay began
to serve it (daemon/interest.py); on whole namespaces, because the ``since``
is older than the cache holds. The catch-up reads the store (routed, with the
range in the cache, MySQL by the user instead), and it must hold the
message: once, in order, with ``recovered: true``.
"""

from __future__ import annotations

import signal

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, func, select

from chat.messages import now_ms
from db.sql import messages
from harness.system import private_system
from tests.e2e.helpers import connect, mongo_docs, mongo_docs_soon, nothing_more, post, receive
from tests.timing import PATIENCE, eventually


def _catch_ups(system) -> dict[str, float]:
    """The daemon's catch-up reads by source (one daemon)."""
    text = httpx.get(f"http://127.0.0.1:{system.daemon_port}/metrics", timeout=PATIENCE).text
    return {s.labels["source"]: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "chat_daemon_catchups_total"}


def _commit_without_mirroring(system, sender: str, recipient: str, body: str) -> int:
    """Commits the next message to MySQL alone, as a writer that died between
    its commit and its copy to the fast store leaves it (an outbox). Its id."""
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.begin() as conn:
            msg_id = conn.execute(select(func.coalesce(func.max(messages.c.id), 0))).scalar_one() + 1
            conn.execute(messages.insert(), {
                "id": msg_id, "sender": sender, "recipient": recipient, "conversation": f"{sender}\x00{recipient}",
                "body": body, "client_msg_id": None, "created_at": now_ms().replace(tzinfo=None)})
        return msg_id
    finally:
        engine.dispose()


@pytest.fixture(params=[("true", 100), ("false", 1), ("true", 0)],
                ids=["routed-by-user", "whole-namespaces", "routed-no-cache"])
def system(request, tmp_path):
    """Databases of its own: no other writer process repairs the outbox while the test's is frozen.
    Whole namespaces, a cache of one message: a catch-up from 0 is not the cache's. Without a
    cache, what the fast store lacks is read from MySQL."""
    routed, cache = request.param
    with private_system(tmp_path, daemons=1, apis=1, writer=True, relay=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_RELAY_ROUTE_BY_USER=routed, CHAT_RECENT_CACHE_MAX=str(cache),
                        CHAT_GAP_CHECK_SECONDS="0.5") as s:
        yield s


async def test_a_catch_up_from_the_store_gets_a_released_message_the_fast_store_lacks(system, users):
    sender, recipient = users("s"), users("u")
    watcher, _ = await connect(system, sender)  # the sender's open socket: it sees what the stream releases
    try:
        first = await post(system, sender, recipient, "in both stores", "first")
        assert first.status_code == 201, first.text
        first_id = int(first.json()["id"])
        assert [f["id"] for f in await receive(watcher, 1)] == [str(first_id)]
        await mongo_docs_soon(system, {"_id": first_id}, 1)

        writer = system.procs["writer"]
        writer.send_signal(signal.SIGSTOP)  # no turn copies the outbox to the fast store until SIGCONT
        try:
            outbox_id = _commit_without_mirroring(system, sender, recipient, "in MySQL only")
            # Released from MySQL by the gap check: the stream's position is past it.
            assert [f["id"] for f in await receive(watcher, 1)] == [str(outbox_id)]
            assert mongo_docs(system, {"_id": outbox_id}) == []  # the fast store lacks it still

            before = _catch_ups(system)
            # The recipient's first socket, resuming from before both messages.
            ws, hello = await connect(system, recipient, since="0")
            after = _catch_ups(system)
            from_store = after.get("mongo", 0) - before.get("mongo", 0)
            from_mysql = after.get("mysql", 0) - before.get("mysql", 0)
            cache = system.env["CHAT_RECENT_CACHE_MAX"]
            if system.env["CHAT_RELAY_ROUTE_BY_USER"] == "true" and cache != "0":
                # Routed, with the range in the cache: the user's blanks are read from MySQL
                # by the user, and the fast store (a scan on FerretDB) not at all.
                assert (from_store, from_mysql) == (0, 1)
            else:
                assert from_store == 1, "the catch-up did not read the store"
                # What the fast store lacks comes from the cache if it holds it, else from MySQL.
                assert from_mysql == (cache == "0")
            assert mongo_docs(system, {"_id": outbox_id}) == [], "the fast store got it during the catch-up"
        finally:
            writer.send_signal(signal.SIGCONT)
        try:
            assert hello["recovered"] is True
            # Everything before the marker message is the catch-up (live frames come after it).
            got = await nothing_more(system, ws, recipient, sender)
            assert [f["id"] for f in got] == [str(first_id), str(outbox_id)]
            assert [f["body"] for f in got] == ["in both stores", "in MySQL only"]
        finally:
            await ws.close()
        # The writer's repair copies the outbox now: the stream drops that entry as a repeat.
        await eventually(lambda: mongo_docs(system, {"_id": outbox_id}), "the outbox copied to the fast store")
        # The sender's socket got it once too: next after it, the recipient's marker only.
        assert [(f["from"], f["body"]) for f in await nothing_more(system, watcher, sender, recipient)] == [
            (recipient, "marker")]
    finally:
        await watcher.close()
