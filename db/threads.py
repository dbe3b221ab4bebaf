"""Threads of one's own for blocking database calls.

asyncio's default executor is left to the libraries. PyMongo resolves the
address of every connection it opens there (``loop.getaddrinfo``), so a
default executor full of slow history reads held the writer's next Mongo
insert back for as long as they took: 3 s in one CI run. Each kind of
blocking work therefore gets a pool sized to the connections it may use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class Threads:
    def __init__(self, count: int, name: str):
        self.count = count
        self._pool = ThreadPoolExecutor(count, thread_name_prefix=name)

    def run(self, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self, last: Callable[[], object] | None = None) -> None:
        """No more work; ``last`` runs after whatever work is under way (a connection's close, on its thread)."""
        if last is not None:
            self._pool.submit(last)
        self._pool.shutdown(wait=False)
