"""How long the tests wait, in one unit, and the one way they wait for a condition.

A test never sleeps until something has happened: it waits for a signal (a
frame, a row, a log line, a metric) with `eventually`, and the time limit of
every wait is a multiple of ``S``. ``S`` is one second times
``CHAT_TESTS_TIMEOUT_FACTOR`` (1 by default): on a slow or loaded machine, raise
the factor instead of editing tests. A limit is how long to wait before calling
a test failed, never a claim that the product is fast; that is a benchmark's.
"""

from harness.waiting import FACTOR, PATIENCE, POLL_SECONDS, eventually, eventually_sync

S = 1.0 * FACTOR

__all__ = ["FACTOR", "PATIENCE", "POLL_SECONDS", "S", "eventually", "eventually_sync"]
