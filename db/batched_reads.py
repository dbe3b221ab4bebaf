"""Reads that answer together whatever was asked for while they were busy.

A daemon asks MySQL for something per user at the moments its users come:
a hello's unread total, a first socket's catch-up. After a restart they all
come at once, and a read each cost a round trip and a thread hand-off per
socket, and as many statements over the same rows. Here a read starts at
once while fewer than ``in_flight`` are under way; what is asked for while
they are waits for the next one free, which takes as many of the waiting as
``choose`` picks and answers each from one statement. An ask alone waits for
no one.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from db.threads import Threads

Ask = TypeVar("Ask")
Answer = TypeVar("Answer")


class BatchedReads(Generic[Ask, Answer]):
    """``read(asks)`` runs on ``threads`` (blocking: one statement) and returns an answer for
    each ask, at its place; ``choose(waiting)`` says which of the waiting asks (oldest first)
    one read takes, by index, the oldest always among them. A read's error is every one of
    its asks' error; an ask whose waiter gave up (cancelled) before its read is not read."""

    def __init__(self, threads: Threads, read: Callable[[list[Ask]], list[Answer]],
                 choose: Callable[[Sequence[Ask]], list[int]], in_flight: int):
        self._threads = threads
        self._read = read
        self._choose = choose
        self._in_flight_most = in_flight
        self._waiting: list[tuple[Ask, asyncio.Future[Answer]]] = []  # oldest first
        self._in_flight = 0

    def ask(self, ask: Ask) -> asyncio.Future[Answer]:
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.append((ask, answer))
        self._read_next()
        return answer

    def _read_next(self) -> None:
        while self._in_flight < self._in_flight_most:
            self._waiting = [(ask, answer) for ask, answer in self._waiting if not answer.done()]
            if not self._waiting:
                return
            chosen = self._choose([ask for ask, _ in self._waiting])
            taken = [self._waiting[i] for i in chosen]
            left = set(chosen)
            self._waiting = [item for i, item in enumerate(self._waiting) if i not in left]
            self._in_flight += 1
            self._threads.run(self._read, [ask for ask, _ in taken]).add_done_callback(
                functools.partial(self._answer, answers=[answer for _, answer in taken]))

    def _answer(self, done: asyncio.Future[list[Answer]], answers: list[asyncio.Future[Answer]]) -> None:
        self._in_flight -= 1
        error = None if done.cancelled() else done.exception()
        for i, answer in enumerate(answers):
            if answer.done():
                continue
            if done.cancelled():
                answer.cancel()
            elif error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(done.result()[i])
        self._read_next()

