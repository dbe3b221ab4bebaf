"""Catch-up served from a daemon's cache of recent messages, with no database
(daemon/recent_cache.py, daemon/catchup.py): exactly the user's messages in
(since, upto], oldest first, from any part of the cache (it is walked from
whichever end is nearer), in pages."""

import gc
from datetime import UTC, datetime, timedelta

import pytest

from daemon import catchup
from daemon.recent_cache import RecentCache

USERS = ["ann", "bob", "cat"]
LONG_AGO = datetime.now(UTC) - timedelta(days=2)


def doc(i):
    return {"_id": i, "from": USERS[i % 3], "to": USERS[(i + 1) % 3], "body": f"m{i}",
            "created_at": datetime.now(UTC)}


@pytest.fixture
def cache():
    c = RecentCache(1000)
    c.extend([doc(i) for i in range(1, 1501)])  # the first 500 fall out
    return c


async def catch_up(cache, user, since, upto, most=None):
    return await catchup.first_page(catchup.paginate(catchup.from_entries(cache.between(since, upto), user), LONG_AGO,
                                                     most, None))


@pytest.mark.parametrize(("since", "upto"), [(500, 510), (500, 1500), (900, 1000), (1400, 1500), (1499, 1500),
                                             (1200, 1201)])
async def test_catch_up_from_the_cache_is_exact_from_either_end(cache, since, upto):
    assert cache.covers(since, upto)
    for user in USERS:
        got = await catch_up(cache, user, since, upto)
        assert got.recovered
        want = [i for i in range(since + 1, upto + 1) if user in (USERS[i % 3], USERS[(i + 1) % 3])]
        assert [msg_id for msg_id, _payload, _ in got.frames] == want
        assert all(f'"body":"m{msg_id}"'.encode() in payload for msg_id, payload, _ in got.frames)


def test_the_cache_covers_only_what_it_holds(cache):
    assert not cache.covers(499, 510)  # 500 fell out
    assert not cache.covers(1400, 1501)  # not yet there
    assert not RecentCache(1000).covers(0, 1)


async def test_catch_up_can_stop_at_the_oldest_few(cache):
    # A long-poll asks for one more than its answer holds, to tell that it is cut.
    got = await catch_up(cache, "bob", 600, 1500, most=4)
    assert [msg_id for msg_id, _payload, _ in got.frames] == [i for i in range(601, 1501) if i % 3 in (0, 1)][:4]
    assert got.more
    assert len((await catch_up(cache, "bob", 1490, 1500, most=100)).frames) == 7


def test_cached_messages_are_not_tracked_by_the_cyclic_gc(cache):
    # A full collection walks every tracked object and stops the event loop
    # meanwhile: a 50,000-message cache must not add to it.
    gc.collect()
    assert len(cache) == 1000
    assert not any(gc.is_tracked(entry) for entry in cache)


def test_a_message_out_of_order_empties_the_cache_so_it_stays_contiguous(cache):
    cache.extend([doc(1502)])  # 1501 never came
    assert [entry[0] for entry in cache] == [1502]


async def test_the_cache_is_bounded_in_bytes_too_and_drops_the_oldest_first():
    c = RecentCache(1000, max_bytes=20_000)
    c.extend([doc(i) for i in range(1, 1501)])
    sizes = [len(entry[4]) for entry in c]
    assert sum(sizes) <= 20_000 < sum(sizes) + 200  # full: one more message would not fit
    assert [entry[0] for entry in c] == list(range(1501 - len(sizes), 1501))  # the newest, contiguous
    got = await catch_up(c, "bob", 1490, 1500)
    assert [msg_id for msg_id, _payload, _ in got.frames] == [i for i in range(1491, 1501) if i % 3 in (0, 1)]


async def test_expired_messages_are_left_out_and_the_page_says_not_recovered(cache):
    cutoff = datetime.now(UTC) + timedelta(seconds=1)  # everything in the cache is older
    got = await catchup.first_page(catchup.paginate(catchup.from_entries(cache.between(1490, 1500), "bob"), cutoff,
                                                    None, None))
    assert got.frames == [] and not got.recovered


def test_a_cached_message_holds_about_its_own_size_of_memory():
    # orjson's bytes keep the allocation they were built in (4.3 KB for a
    # 220-byte payload, measured): 50,000 cached messages were 210 MB. Measured
    # in a fresh process, as resident memory, which is what an operator pays.
    import subprocess
    import sys
    code = """
import gc, psutil
from datetime import datetime, UTC
from daemon.recent_cache import RecentCache
p = psutil.Process(); now = datetime.now(UTC); c = RecentCache(50_000)
before = p.memory_info().rss
c.extend([{"_id": i, "from": f"u{i % 1000}", "to": f"u{(i + 1) % 1000}", "body": "x" * 100,
           "created_at": now} for i in range(1, 50_001)])
gc.collect()
print((p.memory_info().rss - before) / 50_000)
"""
    per_message = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout)
    assert per_message < 1500, per_message


@pytest.mark.parametrize(("since", "upto", "shown", "split"), [
    (0, 10, 10, 10),  # the oplog showed all of it: the fast store answers for the whole range
    (0, 10, 7, 7),  # 8..10 released from MySQL: read from the truth
    (5, 10, 3, 5),  # nothing of the range is known to be in the fast store
    (0, 10, 12, 10),  # shown past the range
])
def test_a_catch_up_reads_the_fast_store_only_up_to_what_the_oplog_has_shown(since, upto, shown, split):
    assert catchup.stored_upto(since, upto, shown) == split


async def test_chained_parts_come_one_after_the_other_and_a_started_one_is_closed_when_the_reader_stops():
    closed: list[str] = []

    async def part(name, ids):
        try:
            for i in ids:
                yield i, LONG_AGO, name.encode()
        finally:
            closed.append(name)

    parts = catchup.chained(part("store", [1, 3]), part("truth", [8, 9]))
    assert [item[0] async for item in parts] == [1, 3, 8, 9]
    early = catchup.chained(part("a", [1, 2]), part("b", [5]))
    assert (await anext(early))[0] == 1
    await early.aclose()
    assert closed == ["store", "truth", "a"]  # b never started: no read of it is left suspended
