"""What a move copies where (chat/moves.py), on maps and rows given as values."""

from datetime import UTC, datetime

import pytest

from chat.messages import Kind, Message
from chat.moves import MovePlan, Progress, copy_targets, origin_of
from chat.partitions import BadPartitions, SlotMap

TWO = SlotMap.even(2)
GROWN = MovePlan(TWO, TWO.grown(4))  # 256-511: 0 -> 1; 512-767: 1 -> 2; 768-1023: 1 -> 3
T0 = datetime(2026, 11, 26, tzinfo=UTC)


def user(before: int, after: int, n: int = 0) -> str:
    found = (u for i in range(100_000) if TWO.partition_of(u := f"u{i}") == before
             and GROWN.after.partition_of(u) == after)
    for _ in range(n):
        next(found)
    return next(found)


def row(msg_id: int, sender: str, recipient: str, origin: tuple[int, int] | None = None, **kw) -> Message:
    part, oid = origin if origin else (None, None)
    return Message(msg_id, sender, recipient, "hi", T0, None, part, oid, **kw)


def test_the_plan_knows_the_moving_slots_their_sources_and_targets():
    assert GROWN.moving == list(range(256, 1024))
    assert (GROWN.sources, GROWN.targets) == ([0, 1], [1, 2, 3])
    assert GROWN.leaving(0) == list(range(256, 512)) and GROWN.leaving(1) == list(range(512, 1024))
    assert GROWN.moves(user(0, 1)) and not GROWN.moves(user(0, 0))
    with pytest.raises(BadPartitions):
        MovePlan(TWO, TWO.grown(4).grown(5))  # two epochs at once


def test_a_row_goes_to_each_moving_party_s_target_but_never_where_it_was_first_written():
    stay, to1, to2, to3 = user(0, 0), user(0, 1), user(1, 2), user(1, 3)
    assert copy_targets(row(1, to1, stay), 0, GROWN) == [1]  # the mover's own original
    assert copy_targets(row(2, stay, to1), 0, GROWN) == [1]
    assert copy_targets(row(3, to2, to3), 1, GROWN) == [2, 3]  # both move, each its own way
    assert copy_targets(row(4, stay, stay), 0, GROWN) == []
    # partition 0 holds a copy of a message written in 1: the 1 -> 2 mover's row is copied to 2 ...
    assert copy_targets(row(5, to2, stay, origin=(1, 9)), 0, GROWN) == []  # ... from 1, not from 0's copy
    assert copy_targets(row(6, stay, to2), 1, GROWN) == [2]  # 1's copy of 0's original: copied as 0's
    assert origin_of(row(6, stay, to2, origin=(0, 3)), 1) == (0, 3) and origin_of(row(7, stay, to2), 1) == (1, 7)
    # a row written in the target itself is there already
    back = MovePlan(TWO, TWO.move(range(10), 1))
    mover = next(u for i in range(100_000) if back.moves(u := f"m{i}"))
    assert copy_targets(row(8, user(1, 2), mover, origin=(1, 4)), 0, back) == []
    assert copy_targets(row(9, mover, user(1, 2), kind=Kind.READ, ref_id=8), 0, back) == [1]


def test_the_move_in_progress_round_trips_through_its_text():
    progress = Progress.start(GROWN)
    assert progress.copied == {0: 0, 1: 0}
    progress.copied[1] = 500
    again = Progress.decode(progress.encode())
    assert again == progress and again.plan.after == TWO.grown(4)
    with pytest.raises(BadPartitions):
        Progress.decode('{"plan": 1}')
