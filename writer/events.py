"""The writer's rules for events (docs/receipts.md): pure, no I/O.

A batch's events are judged against ``Facts``, what MySQL held when the batch
began (read in one go by ``writer.event_sql.read_facts``), which the batch
updates as it goes: an edit then a delete of one message in one batch are
judged one after the other, as two batches would be.

- EDIT/DELETE: the sender's own message, not deleted, within the edit window.
  The row names it (``ref_id``) and is addressed to its recipient.
- READ: a message of the reader's stream between the reader and the peer, not
  deleted, not past the newest id. The marker is the newest message *from the
  peer* up to it (what "read" means to the peer's ticks and to the unread
  count), and only ever moves up: an older one writes nothing.
- ACK: a position of the device's user's stream, not past the newest id. A
  user's highest position over their devices moving up writes one DELIVERED
  row per peer whose messages it passed, "up to" the newest of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from chat.drafts import Draft
from chat.messages import Kind, Message
from chat.write_errors import (
    EditWindowClosed,
    MessageDeleted,
    MessageNotFound,
    NotInConversation,
    NotSender,
    PastNewest,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class Referenced:
    """What the rules read of a message an event names."""

    sender: str
    recipient: str
    kind: int
    deleted: bool
    created_at: datetime


@dataclass(slots=True)
class Facts:
    """What MySQL held for a batch's events when it began, updated as the batch goes."""

    last_id: int  # the newest id of the partition before the batch
    refs: dict[int, Referenced] = field(default_factory=dict)
    markers: dict[tuple[str, str], int] = field(default_factory=dict)  # (reader, peer) -> upto
    # (reader, peer, id) -> the newest message from peer to reader at or below id (0: none)
    peer_newest: dict[tuple[str, str, int], int] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)  # user -> highest position over their devices
    devices: dict[tuple[str, str], int] = field(default_factory=dict)  # (user, device) -> position
    # user -> {peer: newest id of peer's messages to user} in (acked[user], the batch's highest ack]
    passed: dict[str, dict[str, int]] = field(default_factory=dict)


def judge_revision(draft: Draft, facts: Facts, now: datetime, window_seconds: int) -> Referenced:
    """The message an EDIT or DELETE draft may revise, or the refusal."""
    ref = facts.refs.get(draft.ref_id or 0)
    if ref is None or ref.kind != Kind.MESSAGE:
        raise MessageNotFound("no such message")
    if ref.sender != draft.sender:
        raise NotSender("not the sender")
    if ref.deleted:
        raise MessageDeleted("deleted")
    if now - ref.created_at > timedelta(seconds=window_seconds):
        raise EditWindowClosed("past the edit window")
    return ref


def judge_read(draft: Draft, facts: Facts) -> int:
    """The marker a READ draft asks for (the newest message from the peer at or
    below its id, 0 if none), or the refusal."""
    upto = draft.ref_id or 0
    ref = facts.refs.get(upto)
    if ref is None:
        if upto > facts.last_id:
            raise PastNewest("past the newest id")
        raise MessageNotFound("no such message")
    if ref.kind != Kind.MESSAGE:
        raise MessageNotFound("not a message")
    reader, peer = draft.sender, draft.recipient
    if {ref.sender, ref.recipient} != {reader, peer} or reader == peer and ref.sender != reader:
        raise NotInConversation("not between you and peer")
    if ref.deleted:
        raise MessageDeleted("deleted")
    if ref.sender == peer:
        return upto
    return facts.peer_newest.get((reader, peer, upto), 0)


def judge_ack(draft: Draft, facts: Facts) -> None:
    if (draft.ref_id or 0) > facts.last_id:
        raise PastNewest("past the newest id")


def revised(original: Referenced, kind: int) -> None:
    """The batch's view of a message once revised: a delete is seen by later events of the batch."""
    if kind == Kind.DELETE:
        original.deleted = True


def delivered_rows(user: str, facts: Facts, before: int, after: int) -> list[tuple[str, int]]:
    """(peer, upto) of the DELIVERED rows a user's highest position moving from
    ``before`` to ``after`` writes: one per peer whose messages it passed."""
    if after <= before:
        return []
    return sorted((peer, upto) for peer, upto in facts.passed.get(user, {}).items() if before < upto <= after)


def event_message(draft: Draft, msg_id: int, recipient: str, created_at: datetime, ref_id: int) -> Message:
    """The row an accepted event writes."""
    body = draft.body if draft.kind == Kind.EDIT else ""
    client_msg_id = draft.client_msg_id if draft.kind in (Kind.EDIT, Kind.DELETE) else None
    return Message(msg_id, draft.sender, recipient, body, created_at, client_msg_id, kind=draft.kind, ref_id=ref_id)


def unchanged(draft: Draft, upto: int) -> Message:
    """The answer to a READ or ACK that writes no row: id 0, ``ref_id`` the marker or position as it stands."""
    return Message(0, draft.sender, draft.recipient, "", EPOCH, None, kind=draft.kind, ref_id=upto)

