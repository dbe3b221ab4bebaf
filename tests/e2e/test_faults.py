"""Faults under traffic, counted by reconnecting clients: a daemon killed
with SIGKILL and FerretDB restarted while two API processes write
concurrently (the case where FerretDB's own oplog skips, reorders and
repeats entries). Zero loss, zero duplicates, per-recipient order."""

import asyncio
import random
import signal

import httpx
import pytest

from chatctl.client import Inbox, listen
from tests.e2e.helpers import post
from tests.system import private_system


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    with private_system(tmp_path_factory.mktemp("faults"), daemons=2, apis=2, CHAT_RATE_LIMIT_PER_SECOND=0,
                        CHAT_DB_TIMEOUT_SECONDS=1, CHAT_GAP_CHECK_SECONDS=1) as system:
        yield system


async def run_traffic(system, users, messages: int, rate: float, faults):
    receivers = [users(f"r{i}") for i in range(12)]
    senders = [users(f"s{i}") for i in range(6)]
    inboxes, tasks = {}, []
    for r in receivers:
        inboxes[r] = Inbox()
        tasks.append(asyncio.create_task(listen(system.ws_url, system.token(r), None, lambda f: None,
                                                max_backoff=0.5, inbox=inboxes[r])))
    await asyncio.sleep(1.0)  # everyone connected and holding a cursor
    expected: dict[str, list[int]] = {r: [] for r in receivers}
    rng = random.Random(7)
    fault_task = asyncio.create_task(faults())

    async def one(i, client):
        to = rng.choice(receivers)
        for _attempt in range(20):  # a client retries with its client_msg_id until stored
            try:
                r = await post(system, rng.choice(senders), to, f"m{i}", f"id-{i}", client=client)
                if r.status_code in (200, 201):
                    return to, int(r.json()["id"])
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        raise AssertionError(f"message {i} was never accepted")

    async with httpx.AsyncClient(timeout=10) as client:
        pending = []
        for i in range(messages):
            pending.append(asyncio.create_task(one(i, client)))
            await asyncio.sleep(1 / rate)
        for to, msg_id in await asyncio.gather(*pending):
            expected[to].append(msg_id)
    await fault_task
    return receivers, expected, inboxes, tasks


async def wait_delivered(expected, inboxes, timeout=40):
    async with asyncio.timeout(timeout):
        while not all(set(expected[r]) <= inboxes[r].seen for r in expected):
            await asyncio.sleep(0.2)


async def test_daemon_sigkill_and_ferretdb_restart_under_traffic_lose_and_repeat_nothing(faulty, users):
    async def faults():
        await asyncio.sleep(1.5)
        faulty.stop("daemon_0", signal.SIGKILL)
        await asyncio.sleep(1.0)
        faulty.start("daemon_0")
        await asyncio.sleep(1.0)
        faulty.dbs.ferretdb.stop()
        await asyncio.sleep(1.0)
        faulty.dbs.ferretdb.start()

    receivers, expected, inboxes, tasks = await run_traffic(faulty, users, messages=400, rate=80, faults=faults)
    try:
        await wait_delivered(expected, inboxes)
        for r in receivers:
            inbox = inboxes[r]
            assert inbox.duplicates == 0, f"{r} got a message twice"
            assert sorted(inbox.ids) == sorted(expected[r]), f"{r} lost messages"
            assert inbox.ids == sorted(inbox.ids), f"{r} got messages out of order"
        assert sum(len(v) for v in expected.values()) == 400
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
