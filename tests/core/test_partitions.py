"""The slot map and cursors: which partition a user is in, and what may resume."""

import pytest

from chat.partitions import (
    SLOTS,
    BadPartitions,
    Cursor,
    SlotMap,
    collection_name,
    lock_name,
    parse_cursor,
    parse_served,
    resume_position,
    slot_of,
)


def test_slot_is_crc32_and_stable():
    # The same value any language computes: CRC-32 (zlib / IEEE) of the UTF-8 bytes, mod 1024.
    assert slot_of("alice") == 0x278EBC47 % SLOTS  # zlib.crc32(b"alice")
    assert slot_of("émile") == 0x21535E53 % SLOTS  # zlib.crc32("émile".encode())


def test_even_map_splits_slots_into_equal_ranges():
    m = SlotMap.even(4)
    assert [len(m.slots_of(p)) for p in range(4)] == [256, 256, 256, 256]
    assert m.owner[0] == 0 and m.owner[SLOTS - 1] == 3
    assert SlotMap.even(1).partition_of("anyone") == 0


def test_names_of_partition_zero_are_the_single_streams():
    assert (collection_name(0), lock_name(0)) == ("messages", "chat.writer")
    assert (collection_name(3), lock_name(3)) == ("messages_p3", "chat.writer.p3")


def test_users_spread_over_partitions():
    m = SlotMap.even(4)
    counts = [0] * 4
    for i in range(4000):
        counts[m.partition_of(f"u{i}")] += 1
    assert all(800 < c < 1200 for c in counts), counts


def test_move_bumps_epoch_and_marks_only_moved_slots():
    m = SlotMap.even(2)
    moved = m.move([0, 1, 600], to=1)  # 600 is already in partition 1
    assert moved.epoch == 1
    assert moved.owner[0] == moved.owner[1] == 1 and moved.moved[:2] == (1, 1)
    assert moved.moved[600] == 0 and moved.moved[2] == 0
    with pytest.raises(BadPartitions):
        m.move([SLOTS], to=0)


def test_grown_moves_only_slots_whose_partition_changes():
    m = SlotMap.even(2).grown(4)
    assert m.epoch == 1 and m.partitions == 4
    assert m.owner == SlotMap.even(4).owner
    stayed = [s for s in range(SLOTS) if m.moved[s] == 0]
    assert stayed and all(SlotMap.even(2).owner[s] == m.owner[s] for s in stayed)


def test_map_encodes_and_decodes():
    m = SlotMap.even(3).move(range(10), to=2)
    assert SlotMap.decode(m.encode()) == m
    assert len(m.encode()) < 200
    for bad in ("", "{}", '{"epoch": 0, "partitions": 2, "owner": [[0, 5, 0]], "moved": [[0, 1024, 0]]}',
                '{"epoch": 0, "partitions": 1, "owner": [[0, 1024, 3]], "moved": [[0, 1024, 0]]}'):
        with pytest.raises(BadPartitions):
            SlotMap.decode(bad)


def test_served_partitions():
    assert parse_served("", 3) == {0, 1, 2}
    assert parse_served(" 0, 2 ", 3) == {0, 2}
    assert parse_served("%2=1", 4) == {1, 3} and parse_served("%2=1", 8) == {1, 3, 5, 7}  # grows with the map
    assert parse_served("%3=0", 2) == {0}
    for bad in ("3", "x", "-1", "1,,2", "%0=0", "%2=2", "%2", "%x=1", "%4=3"):  # %4=3: none of 3
        with pytest.raises(BadPartitions):
            parse_served(bad, 3)


def test_cursor_round_trip_and_single_stream_form():
    assert Cursor(0, 0, 42).encode() == "42"
    assert Cursor(2, 5, 42).encode() == "2.5.42"
    assert parse_cursor("2.5.42") == Cursor(2, 5, 42)
    assert parse_cursor("42") == Cursor(None, 0, 42)
    for bad in (None, "", "x", "1.2", "1.2.3.4", "-1", "1.2.-3", "٣", "9" * 20, "64.0.1", "1..2"):
        assert parse_cursor(bad) is None, bad


def test_resume_only_where_the_cursor_was_made():
    m = SlotMap.even(4)
    user = "u1"
    home = m.partition_of(user)
    assert resume_position(Cursor(home, 0, 7), user, m) == 7
    assert resume_position(Cursor((home + 1) % 4, 0, 7), user, m) is None
    assert resume_position(Cursor(None, 0, 7), user, m) == 7
    assert resume_position(None, user, m) is None


def test_moved_slot_makes_older_cursors_unrecoverable():
    m = SlotMap.even(2)
    user = "u1"
    old = m.partition_of(user)
    new_map = m.move([slot_of(user)], to=1 - old)
    # A cursor of the old partition, or a bare id: recovered: false, never a silent gap.
    assert resume_position(Cursor(old, 0, 9), user, new_map) is None
    assert resume_position(Cursor(None, 0, 9), user, new_map) is None
    # A cursor made in the new partition after the move resumes.
    assert resume_position(Cursor(1 - old, new_map.epoch, 3), user, new_map) == 3
    # A user whose slot did not move keeps resuming with cursors of the old epoch.
    other = next(f"v{i}" for i in range(1000) if slot_of(f"v{i}") != slot_of(user))
    assert resume_position(Cursor(new_map.partition_of(other), 0, 4), other, new_map) == 4
