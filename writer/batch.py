"""A batch of requests on its way through the writer, and how each is answered."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from chat.drafts import Draft
from chat.errors import ChatError
from chat.messages import Kind, Message
from chat.write_errors import ClientIdConflict
from writer.copies import Copy

log = logging.getLogger("chat.writer")


@dataclass(slots=True)
class Pending:
    """One request: its draft (or a copy owed to this partition), and the future its answer settles."""
    draft: Draft | Copy
    future: asyncio.Future = field(repr=False)
    handed: int | None = None  # a copy handed over in this process: its number (copies.OwedRead)


def owed_copy(copy: Copy, handed: int | None = None) -> Pending:
    """A copy owed to this partition as a request (``handed``: its hand-over's
    number, None for one drained from the echoes). Nobody waits for its answer: a
    failure leaves its echo row, and a later turn's drain makes the copy."""
    future = asyncio.get_running_loop().create_future()
    future.add_done_callback(_copy_settled)
    return Pending(copy, future, handed)


def _copy_settled(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("event=copy_deferred error=%s", future.exception().__class__.__name__)


@dataclass(slots=True)
class Committed:
    """One batch after its MySQL commit: what to insert into Mongo and whom to answer."""
    new_messages: list[Message]
    answers: list[tuple[Pending, Message, bool]]  # (request, message, created): False for a retry's original
    started: float  # time.perf_counter() when the batch's commit began
    stamped: float  # time.monotonic() when created_at was taken, just before the INSERT
    others_waiting: bool  # another process is queued for the lock: hand over after this batch
    owed: list[tuple[int, Copy]] = field(default_factory=list)  # (partition, copy) this batch's originals owe
    refused: list[tuple[Pending, Exception]] = field(default_factory=list)  # events the rules refused, and why


class CommitFailed(ChatError):
    """The batch's COMMIT (or the handover check in its transaction) failed: it may have taken."""

    def __init__(self, committed: Committed):
        super().__init__("commit failed")
        self.committed = committed


def answer(pending: Pending, msg: Message, created: bool) -> None:
    """Settles one request; a retry whose recipient or body differs from the original is a conflict."""
    if pending.future.done():
        return
    d = pending.draft
    if not created and msg.id and _differs(d, msg):
        pending.future.set_exception(ClientIdConflict(msg))
    else:
        pending.future.set_result((msg, created))


def _differs(d: Draft | Copy, stored: Message) -> bool:
    """A retry's stored row is not what the draft asks for (its client_msg_id was used for something else)."""
    if isinstance(d, Copy):
        return False
    if d.kind or stored.kind:  # an edit or delete: the same event of the same message (and body, for an edit)
        return (d.kind, d.ref_id) != (stored.kind, stored.ref_id) or (d.kind == Kind.EDIT and d.body != stored.body)
    return (stored.recipient, stored.body) != (d.recipient, d.body)


def answer_all(committed: Committed) -> None:
    for pending, msg, created in committed.answers:
        answer(pending, msg, created)
    for pending, exc in committed.refused:
        if not pending.future.done():
            pending.future.set_exception(exc)


def fail(batch: list[Pending], exc: Exception) -> None:
    for p in batch:
        if not p.future.done():
            p.future.set_exception(exc)
