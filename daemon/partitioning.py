"""What a daemon decides about partitions, with no I/O: whether it serves a
client (else 421 and the client's partition), where the client's ``since``
resumes, the cursor each message frame carries, and, when the slot map
changes, which of its clients it hands over (``handed_over``) and whether it
can follow the new map in place (``partitions_to_add``).

A daemon serves the users of its partitions only (``CHAT_DAEMON_PARTITIONS``):
its streams hold nothing else, so a client of another partition is sent
where its messages are instead of being served an empty stream. The user's
partition is computed once per request (one CRC-32), never per message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import orjson

from chat.errors import Refused
from chat.messages import Encoded, encode_doc
from chat.parsing import is_decimal
from chat.partitions import BadPartitions, SlotMap, parse_cursor, parse_served, resume_position, slot_of
from daemon.admission import MAX_ID

Encoder = Callable[[dict], Encoded]


def handed_over(old: SlotMap, new: SlotMap, served: Iterable[int], users: Iterable[str]) -> set[str]:
    """Those of ``users`` (connected to a daemon that served ``served`` by
    ``old``) whose clients it must close when ``new`` replaces ``old``: their
    slot moved since ``old``'s epoch. That is the slot now elsewhere, or one
    that left and came back between two maps the daemon saw: its socket
    missed what was written for it meanwhile, and its cursors no longer resume."""
    served = frozenset(served)
    gone = set()
    for user in users:
        slot = slot_of(user)
        if old.owner[slot] in served and (new.owner[slot] != old.owner[slot] or new.moved[slot] > old.epoch):
            gone.add(user)
    return gone


def partitions_to_add(raw_served: str, streamed: frozenset[int], new: SlotMap) -> frozenset[int]:
    """The partitions a daemon whose ``CHAT_DAEMON_PARTITIONS`` is ``raw_served``
    would serve on ``new`` and has no stream for: "" (all) after a grow. A
    listed partition that ``new`` does not have adds nothing (partitions never
    shrink, and such a daemon could not have started)."""
    try:
        wanted = parse_served(raw_served, new.partitions)
    except BadPartitions:
        return frozenset()
    return wanted - streamed


def wrong_partition(user_partition: int, served: frozenset[int], asked: str | None) -> Refused | None:
    """The 421 for a client this daemon must not serve, or None to serve it.

    ``asked`` is the request's ``partition`` parameter (for the proxy's
    routing): one that is not the user's partition is refused too, with the
    right one, so that a client sent by a stale route learns where to go."""
    asked_ok = asked is None or (is_decimal(asked, 2) and int(asked) == user_partition)
    if asked_ok and user_partition in served:
        return None
    return Refused(421, "wrong_partition", f"this user is served by the daemons of partition {user_partition}",
                   extra={"partition": user_partition})


def resume_since(raw: str | None, user: str, slot_map: SlotMap) -> int | None:
    """The position in the user's partition that ``since`` resumes from, or
    None (the client is told ``recovered: false``): absent, malformed, made
    in another partition, or made before the user's slot moved."""
    position = resume_position(parse_cursor(raw), user, slot_map)
    return position if position is not None and position <= MAX_ID else None


def is_single_stream(slot_map: SlotMap) -> bool:
    """One partition that never moved: cursors are bare ids, and frames are the single stream's."""
    return slot_map.partitions == 1 and slot_map.epoch == 0


def cursor_prefix(partition: int, epoch: int) -> str:
    """What goes before a position in the cursor of ``partition`` at ``epoch``
    (``chat.partitions.Cursor.encode``, without building a Cursor per message)."""
    return "" if partition == 0 and epoch == 0 else f"{partition}.{epoch}."


def cursor_text(partition: int, epoch: int, position: int) -> str:
    return cursor_prefix(partition, epoch) + str(position)


def frame_encoder(partition: int, slot_map: SlotMap) -> Encoder:
    """How the stream of ``partition`` encodes a document, once per message.

    Past the single stream at epoch 0, each frame carries its ``cursor``:
    a message's id is a position in its partition only, and the cursor is
    what resumes after a slot moves. The single stream's frames are left as
    they are, byte for byte."""
    if is_single_stream(slot_map):
        return encode_doc
    prefix = cursor_prefix(partition, slot_map.epoch)

    def encode(doc: dict) -> Encoded:
        msg_id, sender, recipient, created, payload = encode_doc(doc)
        return msg_id, sender, recipient, created, with_cursor(payload, prefix + str(msg_id))

    return encode


def with_cursor(payload: bytes, cursor: str) -> bytes:
    """The JSON object ``payload`` with ``"cursor"`` added last."""
    return b"".join((payload[:-1], b',"cursor":', orjson.dumps(cursor), b"}"))

