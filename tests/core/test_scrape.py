"""Quantiles from Prometheus buckets, as the benchmarks read the processes' histograms."""

from loadtest.common.scrape import quantile, quantile_interpolated

INF = float("inf")
# cumulative counts: 50 in (0.01, 0.02], 50 in (0.02, 0.05], none above
BUCKETS = {0.01: 0.0, 0.02: 50.0, 0.05: 100.0, INF: 100.0}


def test_the_bucket_bound_is_the_upper_edge_of_the_quantile_s_bucket():
    assert quantile(BUCKETS, 0.5) == 0.02 and quantile(BUCKETS, 0.99) == 0.05


def test_interpolation_places_the_quantile_inside_its_bucket_as_histogram_quantile_does():
    assert quantile_interpolated(BUCKETS, 0.25) == 0.015
    assert abs(quantile_interpolated(BUCKETS, 0.99) - 0.0494) < 1e-9
    assert quantile_interpolated(BUCKETS, 0.5) == 0.02


def test_a_quantile_past_the_last_finite_bucket_is_that_bucket_s_bound_and_no_samples_is_none():
    assert quantile_interpolated({0.01: 10.0, INF: 20.0}, 0.9) == 0.01
    assert quantile_interpolated({0.01: 0.0, INF: 0.0}, 0.5) is None
    assert quantile_interpolated({}, 0.5) is None
