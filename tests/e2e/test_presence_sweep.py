"""The sweep of a dead daemon's users in Redis (chat/signal_store.py), on a real Redis: a daemon
that held more users than one sweep script withdraws is swept in batches, each user once, and
its entry goes with its last user."""

import pytest
import redis.asyncio as aioredis

from chat.signal_store import DAEMONS, SWEEP_BATCH, SignalStore, daemon_users_key, online_key
from harness.servers import Redis, free_port, running


@pytest.fixture
def redis_alone(tmp_path):
    """A Redis no daemon uses: the live daemons of the shared one would sweep this test's dead one."""
    with running(Redis(tmp_path, free_port())) as server:
        yield server


async def test_a_dead_daemon_with_more_users_than_a_batch_is_swept_in_batches_each_user_once(redis_alone, users):
    client = aioredis.from_url(redis_alone.url)
    store = SignalStore(client)
    try:
        dead, alive = users("dead-daemon"), users("live-daemon")
        held = [users(f"u{i}") for i in range(2 * SWEEP_BATCH + 37)]
        elsewhere = held[:5]  # connected on a live daemon too: they stay online
        await store.apply(dead, [(u, None) for u in held])
        await store.apply(alive, [(u, None) for u in elsewhere])
        await client.zadd(DAEMONS, {dead: 1})  # its last heartbeat, long ago
        batches = []
        while (swept := await store.sweep(timeout_ms=10_000)) is not None:
            daemon, seen, gone = swept
            assert (daemon, seen) == (dead, 1)  # swept with its last heartbeat as their last seen
            batches.append(gone)
        assert len(batches) == 3  # 500, 500 and the rest: no script holds Redis for all of them
        gone = [u for batch in batches for u in batch]
        assert sorted(gone) == sorted(held[5:])  # each user once, those online elsewhere not at all
        assert await store.online(held) == [True] * 5 + [False] * (len(held) - 5)
        assert await client.zscore(DAEMONS, dead) is None
        assert not await client.exists(daemon_users_key(dead))
        assert await client.smembers(online_key(held[0])) == {alive.encode()}
    finally:
        await store.close()
