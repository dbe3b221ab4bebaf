"""What the write API's requests share, made by the lifespan (``api.app``)
and read by the routes and by ``api.post_message``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pymongo import AsyncMongoClient
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from api.errors import ApiError
from api.ratelimit import RateLimiter
from chat.partitions import LiveMap, SlotMap
from chat.settings import Settings
from chat.signal_store import SignalStore
from chat.typing_gate import TypingGate
from db.threads import Threads
from writer.client import RemoteWriter
from writer.partitioned import PartitionedWriter

T = TypeVar("T")
TYPING_GATE_MAX = 10_000


@dataclass
class State:
    settings: Settings
    engine: Engine
    mongo_client: AsyncMongoClient
    writer: PartitionedWriter | RemoteWriter
    limiter: RateLimiter
    reads: Threads  # the blocking MySQL reads; never asyncio's default executor (db.threads)
    maps: LiveMap  # which partition's table holds a user's history: renewed when a move cuts over
    signals: SignalStore | None = None  # typing and presence in Redis; None: CHAT_REDIS_URL is empty
    # POST /v1/typing's throttle: (user, peer) pairs, bounded whoever calls
    typing_gate: TypingGate = field(default_factory=lambda: TypingGate(TYPING_GATE_MAX))
    # and its own rate limit per user (as messages have theirs): a user typing to ever new peers
    # passes every gate, not this
    typing_limiter: RateLimiter | None = None

    @property
    def slot_map(self) -> SlotMap:
        return self.maps.current

    async def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)``, one read from MySQL on the API's read threads, or a
        fast 503. The deadline also covers the wait for a free thread: a burst of
        slow reads queues there, not in the connection pool, whose own timeout it
        would never reach."""
        return await self._on_a_thread(fn, commit=False)

    async def transaction(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` in one transaction, committed if it returns (the
        few writes that are not the writer's: push devices), as ``read`` runs."""
        return await self._on_a_thread(fn, commit=True)

    async def _on_a_thread(self, fn: Callable[[Connection], T], commit: bool) -> T:
        def run() -> T:
            with self.engine.begin() if commit else self.engine.connect() as conn:
                return fn(conn)

        try:
            return await asyncio.wait_for(self.reads.run(run), self.settings.stores.db_timeout_seconds)
        except (SQLAlchemyError, TimeoutError):
            raise ApiError(503, "mysql_unavailable", "the permanent store is unavailable; retry",
                           headers={"Retry-After": "1"}) from None
