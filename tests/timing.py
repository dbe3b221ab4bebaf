"""How long the tests wait, in one unit, and the one way they wait for a condition.

A test never sleeps until something has happened: it waits for a signal (a
frame, a row, a log line, a metric) with `eventually`, and the time limit of
every wait is a multiple of ``S``. ``S`` is one second times
``CHAT_TESTS_TIMEOUT_FACTOR`` (1 by default): on a slow or loaded machine, raise
the factor instead of editing tests. A limit is how long to wait before calling
a test failed, never a claim that the product is fast; that is a benchmark's.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

FACTOR = float(os.environ.get("CHAT_TESTS_TIMEOUT_FACTOR", "1"))
S = 1.0 * FACTOR
# The longest a test waits for something that must come: far above what it
# takes on a loaded 2-core machine, so that reaching it means the thing never came.
PATIENCE = 30 * S
# How often `eventually` looks again. Pacing of the poll, not a wait for an event.
POLL_SECONDS = 0.02

T = TypeVar("T")


async def eventually(check: Callable[[], T | Awaitable[T]], what: str, timeout: float = PATIENCE) -> T:
    """The first truthy value of ``check()`` (a function or a coroutine function),
    looked at every POLL_SECONDS; TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"never happened within {timeout:.0f} s: {what}")
        await asyncio.sleep(POLL_SECONDS)  # pacing: the poll between looks at the condition


def eventually_sync(check: Callable[[], T], what: str, timeout: float = PATIENCE) -> T:
    """`eventually` for tests and fixtures that have no event loop."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"never happened within {timeout:.0f} s: {what}")
        time.sleep(POLL_SECONDS)  # pacing: the poll between looks at the condition
    return value
