"""Faults under traffic, counted by reconnecting clients: a daemon killed
with SIGKILL and FerretDB restarted while two API processes write
concurrently (the case where FerretDB's own oplog skips, reorders and
repeats entries). Zero loss, zero duplicates, per-recipient order.

Each fault comes once traffic has gone on since the one before (messages
stored, counted), and the traffic goes on after the last one."""

import asyncio
import random
import signal

import httpx
import pytest

from chatctl.client import Inbox, listen
from tests.e2e.helpers import post
from harness.system import private_system
from tests.timing import PATIENCE, eventually

MESSAGES = 400  # at least; more if the faults take longer than these take to send
BETWEEN_FAULTS = 50  # messages stored after one fault before the next


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    with private_system(tmp_path_factory.mktemp("faults"), daemons=2, apis=2, CHAT_RATE_LIMIT_PER_SECOND=0,
                        CHAT_DB_TIMEOUT_SECONDS=1, CHAT_GAP_CHECK_SECONDS=1) as system:
        yield system


async def run_traffic(system, users, rate: float, faults):
    """Posts at ``rate`` to 12 listening receivers from the moment all of them
    hold a cursor, while ``faults(stored)`` runs (``stored``: how many messages
    have been stored so far), until it is over and MESSAGES have been sent."""
    receivers = [users(f"r{i}") for i in range(12)]
    senders = [users(f"s{i}") for i in range(6)]
    inboxes, tasks = {}, []
    for r in receivers:
        inboxes[r] = Inbox()
        tasks.append(asyncio.create_task(listen(system.ws_url, system.token(r), None, lambda f: None,
                                                max_backoff=0.5, inbox=inboxes[r])))
    await eventually(lambda: all(inboxes[r].hellos for r in receivers), "every receiver connected, holding a cursor")
    expected: dict[str, list[int]] = {r: [] for r in receivers}
    rng = random.Random(7)
    stored = [0]
    fault_task = asyncio.create_task(faults(stored))

    async def one(i, client):
        to = rng.choice(receivers)
        for _attempt in range(20):  # a client retries with its client_msg_id until stored
            try:
                r = await post(system, rng.choice(senders), to, f"m{i}", f"id-{i}", client=client)
                if r.status_code in (200, 201):
                    stored[0] += 1
                    return to, int(r.json()["id"])
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)  # pacing: a client's back-off before its retry
        raise AssertionError(f"message {i} was never accepted")

    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        pending: list[asyncio.Task] = []
        while len(pending) < MESSAGES or not fault_task.done():
            assert len(pending) < 20 * MESSAGES, "the faults never ended"
            pending.append(asyncio.create_task(one(len(pending), client)))
            await asyncio.sleep(1 / rate)  # pacing: the traffic's rate
        for to, msg_id in await asyncio.gather(*pending):
            expected[to].append(msg_id)
    await fault_task
    return receivers, expected, inboxes, tasks, len(pending)


async def test_daemon_sigkill_and_ferretdb_restart_under_traffic_lose_and_repeat_nothing(faulty, users):
    async def more_stored(stored: list[int], what: str) -> None:
        mark = stored[0]
        await eventually(lambda: stored[0] >= mark + BETWEEN_FAULTS, f"{BETWEEN_FAULTS} messages stored {what}")

    async def faults(stored: list[int]) -> None:
        await more_stored(stored, "before the first fault")
        faulty.stop("daemon_0", signal.SIGKILL)
        await more_stored(stored, "with daemon_0 dead")
        await asyncio.to_thread(faulty.start, "daemon_0")  # until it is ready; the traffic goes on
        await more_stored(stored, "with daemon_0 back")
        await asyncio.to_thread(faulty.dbs.ferretdb.stop)
        await more_stored(stored, "with FerretDB down")  # MySQL is the truth: POSTs are answered
        await asyncio.to_thread(faulty.dbs.ferretdb.start)
        await more_stored(stored, "with FerretDB back")

    receivers, expected, inboxes, tasks, sent = await run_traffic(faulty, users, rate=80, faults=faults)
    try:
        await eventually(lambda: all(set(expected[r]) <= inboxes[r].seen for r in expected),
                         "every stored message delivered")
        for r in receivers:
            inbox = inboxes[r]
            assert inbox.duplicates == 0, f"{r} got a message twice"
            assert sorted(inbox.ids) == sorted(expected[r]), f"{r} lost messages"
            assert inbox.ids == sorted(inbox.ids), f"{r} got messages out of order"
        assert sum(len(v) for v in expected.values()) == sent >= MESSAGES
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
