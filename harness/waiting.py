"""Waiting for a condition, the one way the harness and the tests wait.

A wait looks at its condition every POLL_SECONDS until it holds or its limit
passes. Limits scale with ``CHAT_TESTS_TIMEOUT_FACTOR`` (1 by default): on a
slow or loaded machine, raise the factor instead of editing limits. A limit is
how long to wait before calling a start failed, never a claim that it is fast.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

FACTOR = float(os.environ.get("CHAT_TESTS_TIMEOUT_FACTOR", "1"))
# How often a wait looks again. Pacing of the poll, not a wait for an event.
POLL_SECONDS = 0.02
# The longest the harness waits for something that must come: far above what
# it takes on a loaded 2-core machine, so that reaching it means it never came.
PATIENCE = 30 * FACTOR

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
