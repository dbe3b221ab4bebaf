"""A daemon whose relay is still starting logs its failed attempts to reach
it sparsely (relay/client.py's RepeatedFailures): the first at once, then at
most one line every few seconds that counts the attempts since the line
before. The clock is an argument: these times are made up."""

from relay.client import UNREACHABLE_LOG_SECONDS, RepeatedFailures


def lines_logged(failures: RepeatedFailures, times: list[float]) -> list[tuple[float, int]]:
    """(time, failures counted) of each line logged for failures at these times."""
    return [(t, n) for t in times if (n := failures.failed(t))]


def test_the_first_failure_is_logged_at_once_then_one_line_every_few_seconds_with_a_count():
    failures = RepeatedFailures(every=5.0)
    attempts = [0.0, 0.05, 0.15, 0.35, 0.75, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5, 10.5]
    assert lines_logged(failures, attempts) == [(0.0, 1), (5.5, 9), (10.5, 5)]


def test_a_success_starts_over_and_hands_back_what_no_line_counted():
    failures = RepeatedFailures(every=5.0)
    assert lines_logged(failures, [0.0, 1.0, 2.0]) == [(0.0, 1)]
    assert failures.succeeded() == 2
    assert failures.succeeded() == 0
    # the next outage's first failure is logged at once, however soon it comes
    assert lines_logged(failures, [2.5, 3.0]) == [(2.5, 1)]


def test_a_daemon_logs_at_most_one_line_per_interval():
    failures = RepeatedFailures(every=UNREACHABLE_LOG_SECONDS)
    attempts = [i * 0.05 for i in range(200)]  # ten seconds of attempts at the tightest pace
    logged = lines_logged(failures, attempts)
    assert len(logged) <= 1 + 10 / UNREACHABLE_LOG_SECONDS
    assert sum(n for _t, n in logged) + failures.succeeded() == len(attempts)
