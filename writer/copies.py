"""Where a message is written, and the copies it owes: pure, no I/O.

A message is written first in its sender's partition, its *home*: the POST's
answer is that row, so a retry keyed on (sender, client_msg_id) finds it in
one table, and the sender's other devices see the id the POST answered. A
user's partition must hold every message the user received too, so a message
whose recipient lives in another partition owes a *copy* there, committed by
that partition's writer with an id of that partition's own sequence and
``origin_part``/``origin_id`` naming the original.

The debt is durable: the original's commit inserts an ``echoes`` row
(to_part, from_part, from_id) in the same transaction, and the copy's commit
deletes it in its own. The unique (origin_part, origin_id) of every messages
table makes a copy at most once, however often it is offered (the in-process
hand-over, and the drain of leftover echoes by any writer of that partition).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from chat.messages import Message
from chat.partitions import SlotMap


@dataclass(frozen=True, slots=True)
class Copy:
    """A message owed to its recipient's partition: the original as stored in ``from_part``."""

    original: Message
    from_part: int

    @property
    def origin(self) -> tuple[int, int]:
        return self.from_part, self.original.id

    # What the batch reads of a request (batch.answer: a copy is never a conflicting retry).
    @property
    def sender(self) -> str:
        return self.original.sender

    @property
    def client_msg_id(self) -> str | None:
        return self.original.client_msg_id

    @property
    def recipient(self) -> str:
        return self.original.recipient

    @property
    def body(self) -> str:
        return self.original.body


@dataclass(frozen=True, slots=True)
class Echo:
    """A copy owed: the original ``from_id`` of ``from_part`` is to be copied into ``to_part``."""

    to_part: int
    from_part: int
    from_id: int


def home_of(sender: str, slot_map: SlotMap) -> int:
    """The partition a sender's message is written in first."""
    return 0 if slot_map.partitions == 1 else slot_map.partition_of(sender)


def owed_copies(new: Iterable[Message], home: int, slot_map: SlotMap) -> list[tuple[int, Copy]]:
    """(recipient's partition, copy) of each new original whose recipient lives outside ``home``.
    Copies owe nothing further: a copy is in its recipient's partition by construction."""
    if slot_map.partitions == 1:
        return []
    owed = []
    for msg in new:
        if msg.origin_part is None:
            to_part = slot_map.partition_of(msg.recipient)
            if to_part != home:
                owed.append((to_part, Copy(msg, home)))
    return owed


def echo_rows(owed: Iterable[tuple[int, Copy]]) -> list[Echo]:
    return [Echo(to_part, copy.from_part, copy.original.id) for to_part, copy in owed]


def copy_message(copy: Copy, new_id: int, keep_client_msg_id: bool, ref_id: int | None = None) -> Message:
    """The copy as its partition stores it: its own id there, the original's sender,
    recipient, body and time (both sides see one message), and its origin. It keeps
    the client_msg_id unless that (sender, client_msg_id) is already taken there
    (``keep_client_msg_id`` False), which only a slot move can bring about. An
    event's copy names its message by ``ref_id``, that message's id here."""
    o = copy.original
    return Message(new_id, o.sender, o.recipient, o.body, o.created_at, o.client_msg_id if keep_client_msg_id else None,
                   copy.from_part, o.id, o.kind, ref_id if o.kind else None, o.edited_at, o.deleted)


@dataclass(frozen=True, slots=True)
class OwedRead:
    """The copies owed to a partition as its writer read them under the lock, at a
    turn's start (``echo_sql.leftover_copies``): the ``copies`` to make, their
    origins, all that is owed if ``complete`` (fewer than the read's limit), and
    ``handed_before``: this process's hand-overs numbered below it were made
    before the read began."""

    copies: list[Copy]
    origins: frozenset[tuple[int, int]]
    complete: bool
    handed_before: int

    def made_already(self, origin: tuple[int, int], handed: int | None) -> bool:
        """Whether a copy of ``origin``, handed over as number ``handed`` (None: not
        handed over), is made already, so that offering it to a batch would only
        have the unique (origin_part, origin_id) refuse the batch's INSERT, which is
        then looked up and written again. Its original's commit, and the echo row
        in it, came before the hand-over, so before the read: a complete read that
        did not find the echo means a copy's commit deleted it (another host's
        writer drained it first) or a drain sent it on to the recipient's new
        partition. Either way nothing is owed here."""
        return (handed is not None and handed < self.handed_before and self.complete
                and origin not in self.origins)


class Offers:
    """Which of the copies a leader's watch read as owed (``EchoWatch``) it offers to
    its writer now: each once, and again only if still owed ``again_after`` seconds
    later (the offer was lost: a full queue, a failed turn). A copy's commit deletes
    its echo, so a read after it no longer holds it, and it is forgotten: what it
    remembers is at most one read's worth."""

    __slots__ = ("_again_after", "_offered")

    def __init__(self, again_after: float = 1.0):
        self._again_after = again_after
        self._offered: dict[tuple[int, int], float] = {}  # origin -> when it was last offered

    def __len__(self) -> int:
        return len(self._offered)

    def fresh(self, owed: list[Copy], complete: bool, now: float) -> list[Copy]:
        """Of ``owed`` (a read of the echoes, every one owed if ``complete``), those to offer at ``now``."""
        # An origin the read no longer holds is copied (or sent on): forget it. A read stopped at
        # its limit holds the oldest echoes, in origin order: what it did not reach, past its last, may be owed.
        held = {copy.origin for copy in owed}
        if complete or held:
            reached = None if complete else max(held)
            self._offered = {o: at for o, at in self._offered.items()
                             if o in held or (reached is not None and o > reached)}
        out = []
        for copy in owed:
            at = self._offered.get(copy.origin)
            if at is None or now - at >= self._again_after:
                self._offered[copy.origin] = now
                out.append(copy)
        return out


@dataclass(slots=True)
class Known:
    """What a partition's table already holds of a batch, looked up after its unique keys refused it."""

    originals: dict[tuple[str, str], Message]  # (sender, client_msg_id) -> the stored message
    copies: dict[tuple[int, int], Message]  # (origin_part, origin_id) -> the copy stored

    @classmethod
    def nothing(cls) -> Known:
        return cls({}, {})


def copy_plan(copy: Copy, known: Known) -> tuple[bool, bool]:
    """(write it, keep its client_msg_id) for a copy offered to a batch: not if that
    origin is already copied (an earlier offer, or one in this batch); without its
    client_msg_id if that key already names another message in the table."""
    if copy.origin in known.copies:
        return False, False
    key = copy.original.client_msg_id
    return True, key is None or (copy.original.sender, key) not in known.originals
