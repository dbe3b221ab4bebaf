"""How `chatctl partitions` describes a slot map and which growth it refuses: pure, no database."""

import pytest

from chat.partitions import SlotMap
from chatctl.partitions import ChangeRefused, check_growth, describe


def test_describe_gives_the_epoch_and_each_partition_s_slots_as_ranges():
    assert describe(SlotMap.even(1)) == "epoch 0, 1 partition\npartition 0: 1024 slots 0-1023"
    assert describe(SlotMap.even(2).move([5, 700], 0)).splitlines() == [
        "epoch 1, 2 partitions", "partition 0: 513 slots 0-511,700", "partition 1: 511 slots 512-699,701-1023"]


def test_growth_must_add_partitions_within_the_limit():
    check_growth(SlotMap.even(2), 3)
    for refused in (1, 2, 65):
        with pytest.raises(ChangeRefused):
            check_growth(SlotMap.even(2), refused)
