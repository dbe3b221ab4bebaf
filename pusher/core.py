"""The pusher's decisions, pure: which rows of a partition are due, which of
them no device of their recipient received or read, and the notification each
registered device of that recipient gets (docs/push.md). Every time is an
argument, so the tests drive it with a fake clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from chat.messages import Kind, Message

RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Device:
    user: str
    device: str
    app_id: str
    pushkey: str
    data: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Notification:
    """One request to the gateway, for one device: ``key`` is its idempotency key."""

    key: str
    user: str
    device: str
    request: dict


def due(rows: list[Message], now: datetime,
        delay_seconds: float) -> tuple[list[Message], int | None, datetime | None]:
    """The rows (oldest first) whose delay is over, the id every row up to is decided by
    them (None: none is), and when the first row that is not due yet will be (None: all
    are). Rows are in id order, and ids in commit order: the first one still within its
    delay stops the rest, so that the decided prefix never has a hole."""
    delay = timedelta(seconds=delay_seconds)
    cutoff = now - delay
    taken: list[Message] = []
    for row in rows:
        if row.created_at > cutoff:
            return taken, (taken[-1].id if taken else None), row.created_at + delay
        taken.append(row)
    return taken, (taken[-1].id if taken else None), None


def pause(next_due: datetime | None, now: datetime, tick: float, longest: float) -> float:
    """How long a pusher with nothing left to do now waits: until the next row is due, but
    at least ``tick`` (rows due within it are decided together, not one read each) and at
    most ``longest`` (retries in the outbox come due too). None: no row is waiting, and the
    next read, of nothing or of rows just written, is cheap: ``tick``."""
    if next_due is None:
        return tick
    return min(longest, max(tick, (next_due - now).total_seconds()))


def missed(rows: list[Message], lives_here: Callable[[str], bool], acked: dict[str, int],
           read: dict[tuple[str, str], int], sent_after: datetime | None = None) -> dict[str, list[Message]]:
    """Per recipient: the messages no device of theirs acknowledged and they did not
    read. A message whose recipient lives in another partition is that one's to push
    (its copy is there); the sender's own devices are never pushed. One sent before
    ``sent_after`` (the give-up time ago) is not news any more: nor is the history a
    move of slots copies into a partition."""
    found: dict[str, list[Message]] = {}
    for row in rows:
        user = row.recipient
        if (row.kind != Kind.MESSAGE or row.deleted or user == row.sender or not lives_here(user)
                or (sent_after is not None and row.created_at < sent_after)
                or row.id <= acked.get(user, 0) or row.id <= read.get((user, row.sender), 0)):
            continue
        found.setdefault(user, []).append(row)
    return found


def notifications(partition: int, user: str, rows: list[Message], devices: list[Device], unread: int,
                  content: str) -> list[Notification]:
    """One notification per device for the messages of one window (``rows``, oldest first):
    the Matrix Push Gateway API's ``notification`` object, for the newest of them.
    ``content``: what leaves the system besides ids and counts (``CHAT_PUSH_CONTENT``)."""
    newest = rows[-1]
    out = []
    for device in devices:
        notification: dict = {
            "event_id": str(newest.id),
            "room_id": newest.sender,  # the conversation, as the recipient names it
            "type": "m.room.message",
            "prio": "high",
            "counts": {"unread": unread, "missed_calls": 0},
            "devices": [{"app_id": device.app_id, "pushkey": device.pushkey, "data": device.data}],
        }
        if content in ("sender", "full"):
            notification["sender"] = newest.sender
        if content == "full":
            notification["content"] = {"msgtype": "m.text", "body": newest.body}
        key = f"{partition}:{newest.id}:{user}:{device.device}"
        out.append(Notification(key, user, device.device, {"notification": notification}))
    return out


def retry_in(attempts: int, rng: random.Random) -> float:
    """The wait before attempt ``attempts + 1``: exponential from RETRY_FIRST_SECONDS to
    RETRY_MAX_SECONDS, each uniform in [cap/2, cap], so that a gateway back from an outage
    is not met by every notification at once."""
    cap = min(RETRY_MAX_SECONDS, RETRY_FIRST_SECONDS * 2 ** max(0, attempts - 1))
    return rng.uniform(cap / 2, cap)


def gives_up(created_at: datetime, now: datetime, give_up_seconds: float) -> bool:
    return now - created_at > timedelta(seconds=give_up_seconds)


def rejected_pushkeys(answer: object) -> list[str]:
    """The pushkeys a gateway's 200 answer says to stop using (``{"rejected": [...]}``); [] for anything else."""
    if isinstance(answer, dict) and isinstance(answer.get("rejected"), list):
        return [k for k in answer["rejected"] if isinstance(k, str)]
    return []
