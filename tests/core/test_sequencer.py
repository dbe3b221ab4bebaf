from daemon.sequencer import Sequencer


def docs(*ids):
    return [{"_id": i} for i in ids]


def ids(released):
    return [d["_id"] for d in released]


def test_in_order_entries_are_released_at_once():
    s = Sequencer(high=10)
    assert ids(s.offer(docs(11, 12, 13))) == [11, 12, 13]
    assert s.high == 13 and s.hole is None


def test_an_in_order_batch_that_goes_wrong_part_way_takes_the_careful_path():
    # the fast path releases a batch as it came only if every id is the next one
    s = Sequencer(high=10)
    assert ids(s.offer(docs(11, 12, 12, 14, 13))) == [11, 12, 13, 14]
    assert s.high == 14 and s.repeats == 1 and s.hole is None
    assert ids(s.offer(docs(16, 17))) == [] and s.hole == (14, 17)
    assert ids(s.offer(docs(15))) == [15, 16, 17]


def test_bson_int64_ids_are_ids():
    from bson.int64 import Int64

    s = Sequencer(high=10)
    assert ids(s.offer([{"_id": Int64(11)}, {"_id": Int64(12)}])) == [11, 12]
    assert s.high == 12


def test_repeats_are_dropped_and_counted():
    s = Sequencer(high=10)
    s.offer(docs(11, 12))
    assert ids(s.offer(docs(11, 12, 13))) == [13]
    assert s.repeats == 2


def test_out_of_order_entries_wait_for_the_missing_one():
    s = Sequencer(high=10)
    assert ids(s.offer(docs(13, 12))) == []
    assert s.hole == (10, 13)
    assert ids(s.offer(docs(11))) == [11, 12, 13]
    assert s.hole is None


def test_hole_filled_from_the_truth_releases_in_order_without_repeats():
    s = Sequencer(high=0)
    s.offer(docs(3, 5))
    assert s.hole == (0, 5)
    # the shell reads (0, ...] from the messages collection: 1..5
    assert ids(s.offer(docs(1, 2, 3, 4, 5))) == [1, 2, 3, 4, 5]
    assert s.repeats == 2  # 3 and 5 were held already


def test_skip_past_expired_range_releases_what_is_held():
    s = Sequencer(high=0)
    s.offer(docs(7, 8))
    assert ids(s.skip_to(6)) == [7, 8]
    assert s.high == 8


def test_held_documents_are_bounded_and_the_overflow_is_read_back():
    s = Sequencer(high=0, max_held=3)
    s.offer(docs(5, 6, 7, 8, 9))
    assert s.hole == (0, 7)  # 8 and 9 were dropped, not buffered
    assert ids(s.offer(docs(1, 2, 3, 4, 5, 6, 7, 8, 9))) == list(range(1, 10))


def test_with_a_bound_a_stray_at_the_next_id_is_held_until_the_bound_passes_it():
    # The fast store took a document at the next id before the writer did: with
    # MySQL's committed head at 10, nothing past it goes out, even in order.
    s = Sequencer(high=10, bound=10)
    assert ids(s.offer([{"_id": 11, "body": "forged"}])) == []
    assert s.hole == (10, 11) and s.high == 10
    assert ids(s.offer(docs(12))) == [] and s.hole == (10, 12)
    assert ids(s.confirm(10)) == []  # MySQL's head is still 10
    assert ids(s.confirm(11)) == [11]  # only a bound past it lets it go
    assert s.high == 11 and s.hole == (11, 12)


def test_held_documents_past_the_committed_head_are_dropped():
    s = Sequencer(high=10, bound=10)
    s.offer(docs(11, 12))
    assert s.drop_above(10) == [11, 12]  # MySQL's head is still 10: not the writer's
    assert s.hole is None and s.high == 10


def test_the_truth_with_the_same_id_replaces_the_held_document():
    s = Sequencer(high=10, bound=10)
    s.offer([{"_id": 11, "body": "forged"}])
    released = s.offer_truth([{"_id": 11, "body": "real"}])
    assert released == [{"_id": 11, "body": "real"}]
    assert s.high == 11 and s.bound == 11 and s.hole is None
    assert s.offer([{"_id": 11, "body": "forged"}]) == [] and s.repeats == 1  # never later either


def test_held_documents_go_out_in_order_once_the_bound_covers_them():
    s = Sequencer(high=10, bound=10)
    assert ids(s.offer(docs(12, 11, 13))) == []
    assert ids(s.held_upto(12)) == [11, 12]
    assert ids(s.confirm(12)) == [11, 12]  # the shell checked 11..12 against MySQL
    assert s.high == 12 and s.bound == 12 and s.hole == (12, 13)


def test_the_in_order_batch_is_released_up_to_the_bound_only():
    s = Sequencer(high=10, bound=12)
    assert ids(s.offer(docs(11, 12, 13))) == [11, 12]
    assert s.hole == (12, 13)
    assert ids(s.offer_truth(docs(13, 14))) == [13, 14] and s.bound == 14


def test_a_skip_releases_held_documents_only_up_to_the_bound():
    s = Sequencer(high=0, bound=6)
    s.offer(docs(7, 8))
    assert ids(s.skip_to(6)) == []  # 7 and 8 past the bound: not checked yet
    assert ids(s.confirm(8)) == [7, 8]


def test_without_a_bound_in_order_documents_go_out_as_they_come():
    s = Sequencer(high=10)  # a stream without MySQL
    assert ids(s.offer(docs(11, 12))) == [11, 12]
    assert ids(s.confirm(99)) == [] and s.bound is None


def test_forget_makes_the_picked_held_ids_holes_again():
    picked = {"_id": 3, "picked": True}, {"_id": 5, "picked": True}
    s = Sequencer(high=0)
    s.offer([{"_id": 2}, *picked, {"_id": 4}])
    assert s.forget(4, lambda d: d.get("picked", False)) == [3]  # 5 is past ``upto``
    assert s.held_ids() == [2, 4, 5] and s.hole == (0, 5)
    assert ids(s.offer(docs(1))) == [1, 2]  # 3 is a hole now: 4 and 5 wait for what fills it
    assert ids(s.offer(docs(3))) == [3, 4, 5]
