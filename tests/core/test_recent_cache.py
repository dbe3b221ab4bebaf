"""Catch-up served from a daemon's cache of recent messages, with no database:
exactly the user's messages in (since, upto], oldest first, from any part of
the cache (it is walked from whichever end is nearer)."""

import gc
from datetime import UTC, datetime

import pytest

from daemon.hub import Hub
from daemon.stream import Stream

USERS = ["ann", "bob", "cat"]


def doc(i):
    return {"_id": i, "from": USERS[i % 3], "to": USERS[(i + 1) % 3], "body": f"m{i}",
            "created_at": datetime.now(UTC)}


@pytest.fixture
def stream():
    s = Stream(None, None, Hub(1 << 20), retention_seconds=86_400, cache_max=1000, gap_check_seconds=1)
    s._cache_extend([doc(i) for i in range(1, 1501)])  # the first 500 fall out
    return s


@pytest.mark.parametrize(("since", "upto"), [(500, 510), (500, 1500), (900, 1000), (1400, 1500), (1499, 1500),
                                             (1200, 1201)])
async def test_catch_up_from_the_cache_is_exact_from_either_end(stream, since, upto):
    for user in USERS:
        got = await stream.catch_up(user, since, upto)
        assert got.recovered
        want = [i for i in range(since + 1, upto + 1) if user in (USERS[i % 3], USERS[(i + 1) % 3])]
        assert [msg_id for msg_id, _payload, _ in got.frames] == want
        assert all(f'"body":"m{msg_id}"'.encode() in payload for msg_id, payload, _ in got.frames)


async def test_catch_up_can_stop_at_the_oldest_few(stream):
    # A long-poll asks for one more than its answer holds, to tell that it is cut.
    got = await stream.catch_up("bob", 600, 1500, most=4)
    assert [msg_id for msg_id, _payload, _ in got.frames] == [i for i in range(601, 1501) if i % 3 in (0, 1)][:4]
    assert len((await stream.catch_up("bob", 1490, 1500, most=100)).frames) == 7


def test_cached_messages_are_not_tracked_by_the_cyclic_gc(stream):
    # A full collection walks every tracked object and stops the event loop
    # meanwhile: a 50,000-message cache must not add to it (daemon/stream.py).
    gc.collect()
    assert len(stream._cache) == 1000
    assert not any(gc.is_tracked(entry) for entry in stream._cache)


async def test_the_cache_is_bounded_in_bytes_too_and_drops_the_oldest_first():
    s = Stream(None, None, Hub(1 << 20), retention_seconds=86_400, cache_max=1000, gap_check_seconds=1,
               cache_max_bytes=20_000)
    s._cache_extend([doc(i) for i in range(1, 1501)])
    sizes = [len(entry[4]) for entry in s._cache]
    assert sum(sizes) <= 20_000 < sum(sizes) + 200  # full: one more message would not fit
    assert [entry[0] for entry in s._cache] == list(range(1501 - len(sizes), 1501))  # the newest, contiguous
    assert s._cache_bytes == sum(sizes)
    got = await s.catch_up("bob", 1490, 1500)
    assert [msg_id for msg_id, _payload, _ in got.frames] == [i for i in range(1491, 1501) if i % 3 in (0, 1)]
