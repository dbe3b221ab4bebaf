"""The event loop's lock-free histogram scrapes as prometheus_client's own does."""

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from chat.loop_histogram import LoopHistogram

BUCKETS = (.00025, .001, .005, 1, 10)
SAMPLES = (0.0, .00025, .0002500001, .003, .005, 1, 9.99, 10, 10.5, 1e9)


def exposition(registry: CollectorRegistry) -> list[str]:
    # the creation time is the one line that differs: each histogram has its own
    lines = generate_latest(registry).decode().splitlines()
    return [line for line in lines if not line.startswith("t_seconds_created ")]


def test_same_buckets_count_and_sum_as_the_library_histogram():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    lock_free = LoopHistogram("t_seconds", "doc", BUCKETS, registry=ours)
    library = Histogram("t_seconds", "doc", buckets=BUCKETS, registry=theirs)
    for v in SAMPLES:
        lock_free.observe(v)
        library.observe(v)
    assert exposition(ours) == exposition(theirs)
    assert 't_seconds_bucket{le="0.00025"} 2.0' in exposition(ours)  # "le": a bound counts as inside
    assert 't_seconds_bucket{le="+Inf"} 10.0' in exposition(ours)


def test_a_count_is_that_many_observations_of_the_value():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    LoopHistogram("t_seconds", "doc", BUCKETS, registry=ours).observe(.003, count=4)
    library = Histogram("t_seconds", "doc", buckets=BUCKETS, registry=theirs)
    for _ in range(4):
        library.observe(.003)
    assert exposition(ours) == exposition(theirs)


def test_empty_histogram_scrapes_zeros():
    registry = CollectorRegistry()
    LoopHistogram("t_seconds", "doc", BUCKETS, registry=registry)
    assert 't_seconds_count 0.0' in exposition(registry)
    assert 't_seconds_bucket{le="+Inf"} 0.0' in exposition(registry)


def test_it_says_when_it_was_created_as_the_library_does():
    registry = CollectorRegistry()
    LoopHistogram("t_seconds", "doc", BUCKETS, registry=registry)
    text = generate_latest(registry).decode()
    assert "# TYPE t_seconds_created gauge" in text and "\nt_seconds_created 1." in text


def test_buckets_must_increase_and_inf_is_implied():
    with pytest.raises(ValueError):
        LoopHistogram("t_seconds", "doc", (1, 0.5), registry=None)
    with pytest.raises(ValueError):
        LoopHistogram("t_seconds", "doc", (1, 1), registry=None)
    registry = CollectorRegistry()
    LoopHistogram("t_seconds", "doc", (1, float("inf")), registry=registry)
    assert generate_latest(registry).decode().count('le="+Inf"') == 1
