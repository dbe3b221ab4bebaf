"""A daemon routed by user (daemon/passed.py, daemon/interest.py, the
consumer's ``take``), on fake relay batches: the ids passed over move the
position as the documents would have, a missing id is still a hole, the
check against MySQL covers the whole range, nothing passed over is
delivered or served from the cache, and a user's catch-up joins the live
stream where the relay's marker stands."""

from __future__ import annotations


from chat.messages import encode_doc, shown_digest, shown_digest_of
from daemon.hub import Hub, Subscriber
from daemon.interest import Interest
from daemon.passed import Passed, digest_of, merged, passed_over
from daemon.recent_cache import RecentCache
from daemon.stream_consumer import Consumer
from oplog.events import Subscribed
from relay.routing import PASSED
from tests.relay_frames import NS, Sink, batch, doc


def consumer(checked: bool = False) -> tuple[Consumer, Hub, RecentCache]:
    hub, cache = Hub(1 << 20), RecentCache(100)
    c = Consumer(hub, cache, NS, encode=encode_doc, partition=0, primary=False, checked_by_mysql=checked)
    return c, hub, cache


def live(hub: Hub, user: str) -> Sink:
    sink = Sink()
    sub = Subscriber(sink, user)
    sub.pending = None  # live at once
    hub.register(sub)
    return sink


def test_ids_passed_over_move_the_position_and_only_the_users_messages_are_delivered_and_cached():
    c, hub, cache = consumer()
    a = live(hub, "a")
    m = [doc(i, "s", "a" if i in (2, 5) else "z") for i in range(1, 7)]
    c.take(batch([m[1]], [m[0], m[2]]), 0.0)
    c.take(batch([m[4]], [m[3], m[5]]), 0.0)
    assert c.position == 6 and c.seq.hole is None and c.seen == 6
    assert a.ids == [2, 5]
    assert [e[0] for e in cache] == [1, 2, 3, 4, 5, 6] and cache.covers(0, 6)  # consecutive: blanks in between
    assert [(e[0], e[1], e[2]) for e in cache if e[4]] == [(2, "s", "a"), (5, "s", "a")]


def test_a_missing_id_is_still_a_hole_with_ids_passed_over_around_it():
    c, _hub, _cache = consumer()
    m = [doc(i, "s", "z") for i in range(1, 6)]
    c.take(batch([], [m[0], m[1], m[3]]), 0.0)  # 3 never came
    assert c.position == 2 and c.seq.hole == (2, 4) and c.seen == 4
    c.take(batch([], [m[2]]), 0.0)  # read back (or late): the position goes on
    assert c.position == 4 and c.seq.hole is None


def test_the_check_against_mysql_covers_every_id_of_the_range_passed_over_or_not():
    c, hub, _cache = consumer(checked=True)
    a = live(hub, "a")
    m = [doc(i, "s", "a" if i == 3 else "z") for i in range(1, 5)]
    c.take(batch([m[2]], [m[0], m[1], m[3]]), 0.0)
    assert c.position == 0 and c.seq.held == 4  # nothing past what MySQL confirmed
    held = c.seq.held_upto(4)
    # MySQL's digest of rows 1..4 is the one of the documents themselves: the daemon's
    # (its own documents and the relay's digests of the others') equals it.
    assert digest_of(held) == shown_digest_of(m) and len(held) == 4
    c.release_held(c.seq.confirm(4))
    assert c.position == 4 and a.ids == [3]
    # A document passed over that is not MySQL's row fails the check, as one sent whole would.
    c2, _, _ = consumer(checked=True)
    forged = {**m[0], "body": "not what MySQL holds"}
    c2.take(batch([], [forged, *m[1:]]), 0.0)
    assert digest_of(c2.seq.held_upto(4)) != shown_digest_of(m)


def test_a_document_of_the_fast_store_cannot_pass_for_an_id_passed_over():
    p = passed_over(PASSED.pack(7, 99))
    assert p == [{"_id": 7}] and type(p[0]) is Passed and p[0].digest == 99
    lookalike = {**doc(7, "s", "z"), "digest": 99}
    assert digest_of([lookalike]) == shown_digest(lookalike) != 99  # a plain dict is digested as a document
    around = passed_over(PASSED.pack(1, 0) + PASSED.pack(3, 0))
    assert [d["_id"] for d in merged([doc(2, "s", "a")], around)] == [1, 2, 3]


def test_the_marker_is_handed_on_with_every_id_seen_before_it_held_or_released():
    c, _hub, _cache = consumer(checked=True)
    marks: list[tuple[int, int]] = []
    c.on_subscribed = lambda token, seen: marks.append((token, seen))
    c.take(batch([], [doc(1, "s", "z"), doc(2, "s", "z")]), 0.0)
    c._step(Subscribed(NS, 4), 0.0)
    assert marks == [(4, 2)] and c.position == 0  # held for MySQL, but seen: the user is served past 2


def test_a_users_catch_up_joins_the_live_stream_at_the_marker_and_a_stale_marker_serves_nobody():
    interest = Interest()
    assert interest.hold("u") is True  # its first socket: ask the relay
    interest.asked("u", 5)
    assert interest.hold("u") is False  # its second: already asked
    assert interest.covered_from("u") is None
    assert interest.subscribed(4, seen=10) == []  # an earlier sub's marker: not this one
    assert interest.subscribed(5, seen=12) == ["u"]
    assert interest.covered_from("u") == 12
    assert interest.subscribed(9, seen=20) == [] and interest.covered_from("u") == 12  # served once, from 12
    assert interest.release("u") is None  # one socket left
    generation = interest.release("u")
    assert generation is not None
    assert interest.hold("u") is False  # back within the linger: still served, nothing asked
    assert interest.expire("u", generation) is False
    last = interest.release("u")
    assert last is not None and interest.expire("u", last) is True
    assert interest.covered_from("u") is None and len(interest) == 0
    # Taken again: a new sub, and only its own marker (or a later one) serves it.
    assert interest.hold("u") is True
    interest.asked("u", 11)
    assert interest.subscribed(9, seen=30) == [] and interest.subscribed(11, seen=31) == ["u"]


def test_a_marker_serves_every_user_asked_up_to_it_and_one_let_go_before_its_marker_waits_for_its_new_one():
    interest = Interest()
    for user, token in (("a", 1), ("b", 2), ("c", 3)):
        assert interest.hold(user) is True
        interest.asked(user, token)
    assert sorted(interest.subscribed(2, seen=7)) == ["a", "b"]  # one marker for two subs
    generation = interest.release("c")  # its only socket goes before its marker came
    assert generation is not None and interest.expire("c", generation) is True
    assert interest.subscribed(3, seen=8) == []  # the marker of the sub let go serves nobody
    assert interest.hold("c") is True
    interest.asked("c", 4)
    assert interest.subscribed(3, seen=9) == [] and interest.covered_from("c") is None
    assert interest.subscribed(4, seen=10) == ["c"] and interest.covered_from("c") == 10
    assert interest.covered_from("a") == 7 and interest.covered_from("b") == 7


def test_what_the_oplog_has_shown_is_what_the_fast_store_holds_and_a_fill_does_not_move_it():
    # Ids reach the fast store in id order: every id up to the highest the oplog showed
    # (a document or an id passed over) is there. Ids released from MySQL past it may not be.
    c, _hub, _cache = consumer()
    c.start_at(2, stored=1)
    assert c.shown == 1
    c.take(batch([doc(4, "s", "a")], [doc(3, "s", "z")]), 0.0)
    assert c.shown == 4
    c.release(c.seq.offer([doc(5, "s", "a"), doc(6, "s", "z")]), 0.0)  # as a fill from MySQL releases them
    assert c.position == 6 and c.shown == 4


def test_a_marker_serves_the_users_asked_up_to_its_number_in_the_order_asked_and_looks_no_further():
    interest = Interest()
    for user, token in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
        assert interest.hold(user) is True
        interest.asked(user, token)
    generation = interest.release("a")
    assert generation is not None and interest.expire("a", generation) is True
    assert interest.hold("a") is True
    interest.asked("a", 5)  # taken again: asked after every other one waiting
    assert interest.subscribed(3, seen=10) == ["b", "c"]
    assert interest.subscribed(4, seen=11) == ["d"]
    assert interest.subscribed(5, seen=12) == ["a"]
    assert [interest.covered_from(u) for u in "abcd"] == [12, 10, 10, 11]
