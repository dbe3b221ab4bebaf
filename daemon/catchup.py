"""Catch-up pages: a user's messages after ``since``, oldest first, cut into
pages by count and bytes, with ``recovered`` False where messages are missing.
Pure: the items come from the recent cache or from a read of the store
(``daemon.stream``), and nothing here does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from chat.messages import Encoded

class _Gap(enum.Enum):
    GAP = enum.auto()


GAP: Final = _Gap.GAP  # in a catch-up's items: messages may be missing here

# (id, created_at, JSON payload) of one of the user's messages, or GAP
MessageOrGap = tuple[int, datetime, bytes] | Literal[_Gap.GAP]


@dataclass
class CatchUp:
    recovered: bool
    frames: list[tuple[int, bytes, None]]
    more: bool = False  # another page follows


async def no_items() -> AsyncGenerator[MessageOrGap, None]:
    return
    yield  # an async generator that yields nothing


async def from_entries(entries: list[Encoded], user: str) -> AsyncGenerator[MessageOrGap, None]:
    """The user's messages (either side) among ``entries``: a snapshot of the
    recent cache (``RecentCache.between``), taken by the caller before anything
    is awaited. Not the cache itself: a generator's body runs at its first
    read, after the caller's awaits, and the cache moves on meanwhile."""
    for msg_id, sender, recipient, created_at, payload in entries:
        if recipient == user or sender == user:
            yield msg_id, created_at, payload


def stored_upto(since: int, upto: int, shown: int) -> int:
    """Where a catch-up of (since, upto] from the store stops reading the fast
    store: at ``shown``, the highest id the oplog has shown, below which it
    holds every id (ids reach it in id order). Past it are ids the stream
    released from MySQL (a writer's outbox), which the fast store may lack:
    read there, they would be skipped without a gap to say so. The reader
    takes (since, result] from the fast store and (result, upto] from the truth."""
    return min(upto, max(since, shown))


async def chained(*parts: AsyncGenerator[MessageOrGap, None]) -> AsyncGenerator[MessageOrGap, None]:
    """The items of ``parts`` one part after the other: consecutive ranges, oldest first."""
    try:
        for part in parts:
            async for item in part:
                yield item
    finally:
        for part in parts:  # a reader that stops early leaves no read suspended
            await part.aclose()


async def paginate(items: AsyncGenerator[MessageOrGap, None], cutoff: datetime, most: int | None,
                   max_bytes: int | None) -> AsyncGenerator[CatchUp, None]:
    """``items`` in pages of at most ``most`` messages and ``max_bytes`` of
    payload (one message at least); the last page has ``more`` False.

    A page's ``recovered`` is False if messages before or in it were left
    out: created before ``cutoff`` (expired), or a GAP in the items (the store
    lost some while it was read). On the first page that sends the client to
    reload history. On a later one, messages expired while the client read
    the earlier pages: a caller must not pass that page on as if nothing were
    missing (the WebSocket closes, and the client's resume finds the gap)."""
    page = _Page(most, max_bytes)
    try:
        async for item in items:
            if item is GAP:
                # What was read before the gap goes out as it was; the page
                # after it says that messages are missing.
                if page.frames:
                    yield page.result(more=True)
                    page = _Page(most, max_bytes)
                page.recovered = False
                continue
            msg_id, created_at, payload = item
            if created_at < cutoff:
                page.recovered = False
                continue
            if page.full(len(payload)):
                yield page.result(more=True)
                page = _Page(most, max_bytes)
            page.add(msg_id, payload)
        yield page.result(more=False)
    finally:
        await items.aclose()  # a reader that stops early leaves no store read suspended


async def first_page(pages: AsyncGenerator[CatchUp, None]) -> CatchUp:
    """The first page of a catch-up; the rest is never read."""
    try:
        return await anext(pages)
    finally:
        await pages.aclose()


class _Page:
    """One page of a catch-up being filled, oldest first."""

    __slots__ = ("most", "max_bytes", "recovered", "frames", "size")

    def __init__(self, most: int | None, max_bytes: int | None):
        self.most, self.max_bytes = most, max_bytes
        self.recovered, self.size = True, 0
        self.frames: list[tuple[int, bytes, None]] = []

    def full(self, adding: int) -> bool:
        """Whether a payload of ``adding`` bytes must start the next page."""
        return bool(self.frames) and (len(self.frames) == self.most
                                      or (self.max_bytes is not None and self.size + adding > self.max_bytes))

    def add(self, msg_id: int, payload: bytes) -> None:
        self.frames.append((msg_id, payload, None))
        self.size += len(payload)

    def result(self, more: bool) -> CatchUp:
        return CatchUp(self.recovered, self.frames, more)
