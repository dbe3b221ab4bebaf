"""The projection of the cluster bench's CPU per message past two cores (pure)."""

import pytest

from loadtest.cluster.capacity import pick_run, project

RESULT = {"runs": [
    {"mode": "global-lock", "partitions": 1, "cpu_us_per_msg": {"writer": 1000.0}},
    {"mode": "partitioned", "partitions": 1, "cpu_us_per_msg": {"writer": 900.0}},
    {"mode": "partitioned", "partitions": 4, "daemon_decoded_share": [0.5, 0.5],
     "cpu_us_per_msg": {"api": 700.0, "writer": 2000.0, "relay": 300.0, "daemon": 800.0, "ferretdb": 5000.0}},
]}


def test_the_run_with_the_most_partitions_unless_asked():
    assert pick_run(RESULT)["partitions"] == 4
    assert pick_run(RESULT, 1)["cpu_us_per_msg"]["writer"] == 900.0
    with pytest.raises(ValueError):
        pick_run(RESULT, 8)


def test_cores_scale_with_rate_and_the_writer_splits_over_partitions():
    rows = {stage: cores for stage, cores, _ in project(pick_run(RESULT), rate=10_000, partitions=10, core_busy=1.0)}
    assert rows["writer"] == "20.0"  # 2,000 µs × 10,000 msg/s
    assert rows["writer, per partition"] == "2.00"
    assert rows["ferretdb"] == "50.0"
    assert rows["ours in total"] == "38.0"  # api 7 + writer 20 + relay 3 + daemon 8; FerretDB apart
    assert rows["hosts of 8 cores for ours"] == "5"
    assert rows["daemon decodes"] == "50% of the stream"
