"""Which daemon gets which entry: the relay's routing decision. Pure: tested
with lists of plain entries (tests/core/test_relay_routing.py).

A daemon delivers a message to the connections of its recipient and its
sender (``daemon.hub.Hub.dispatch``: the ``to`` and ``from`` of the
document an insert entry carries, whatever its kind: a message, an edit, a
receipt). A daemon that routes by user tells the relay which users it holds
(relay/client.py), and the relay cuts each namespace's part of a batch for
it: the entries that insert a document from or to one of its users, whole;
of every other message document, only its id and the digest of what it
shows (``chat.messages.shown_digest``), packed in ``passed``. The daemon
counts those ids as seen without decoding them, so its "every id up to N
has been seen" stays exact (the gap check, daemon/sequencer.py), and its
check against MySQL (the count and digest of a range of rows,
daemon/stream_fills.py) still covers every id of the range.

What the relay cannot route goes to every daemon of its namespace, as it
did before: a transaction's ``applyOps`` entry, and a document that is not
in the writer's shape (each daemon logs and skips it,
``daemon.stream_consumer.admit``). Entries that insert nothing (updates,
deletes) go to no daemon routed by user: a daemon reads inserts only
(``chat.messages.inserted_docs``).

Each entry is encoded once (``Part.encoded``), whatever the daemons; a
daemon's frame is cut from those bytes (``batch_frame``).
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from dataclasses import dataclass, field

import bson
from bson import Binary, Timestamp

from chat.messages import is_message_doc, shown_digest

# An id passed over and its digest: both unsigned 64-bit, little endian.
PASSED = struct.Struct("<QQ")
_LENGTH = struct.Struct("<i")

# Routing keys: (id, from, to, digest) of a message document; EVERY: every
# daemon of the namespace gets the entry; NONE: none routed by user does.
EVERY = 0
NONE = 1
Key = tuple[int, str, str, int] | int


@dataclass(slots=True)
class Part:
    """One namespace's part of one oplog batch, as the relay keeps it in its ring."""

    namespace: str
    last_ts: Timestamp
    encoded: list[bytes]  # each entry as a daemon gets it (``relay.protocol.slim``), BSON, in oplog order
    keys: list[Key]  # how each entry is routed
    _whole: bytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def whole(self) -> bytes:
        """The frame of the whole part, for a daemon that takes whole namespaces: made the first
        time one asks, then kept with the part. With every daemon routed by user none asks, and
        making it for every part would cost about a tenth of the relay's CPU per entry."""
        if self._whole is None:
            self._whole = whole_frame(self.encoded)
        return self._whole


def key_of(entry: dict, namespace: str) -> Key:
    """How one entry of ``namespace``'s part is routed."""
    op = entry.get("op")
    if op == "i" and entry.get("ns") == namespace:
        doc = entry.get("o")
        if isinstance(doc, dict) and is_message_doc(doc):
            return int(doc["_id"]), doc["from"], doc["to"], shown_digest(doc)
        return EVERY  # not the writer's shape: every daemon logs it, as before
    if op == "c":
        return EVERY  # a transaction's inserts: not split here
    return NONE


def part_of(namespace: str, entries: list[dict], encoded: list[bytes]) -> Part:
    """``entries`` (one namespace's, in order) with their encodings, routed once for every daemon."""
    return Part(namespace, entries[-1]["ts"], encoded, [key_of(e, namespace) for e in entries])


def cut(part: Part, users: Collection[str]) -> tuple[list[bytes], bytes]:
    """What a daemon holding ``users`` gets of ``part``: the entries for
    them (and those routed to every daemon), and the (id, digest) of every
    other message document, packed."""
    sent: list[bytes] = []
    passed: list[bytes] = []
    pack = PASSED.pack
    for data, key in zip(part.encoded, part.keys, strict=True):
        if type(key) is tuple:
            msg_id, sender, recipient, digest = key
            if recipient in users or sender in users:
                sent.append(data)
            else:
                passed.append(pack(msg_id, digest))
        elif key == EVERY:
            sent.append(data)
    return sent, b"".join(passed)


def passed_count(passed: bytes) -> int:
    """How many ids a batch's ``passed`` packs."""
    return len(passed) // PASSED.size


def unpack_passed(passed: bytes) -> list[tuple[int, int]]:
    """The (id, digest) pairs of a batch's ``passed``."""
    return list(PASSED.iter_unpack(passed))


def whole_frame(encoded: list[bytes]) -> bytes:
    """``{"b": [entries]}`` from entries encoded already: the frame of a daemon that takes whole namespaces."""
    body = b"\x04b\x00" + _array(encoded)
    return _LENGTH.pack(len(body) + 5) + body + b"\x00"


def batch_frame(namespace: str, last_ts: Timestamp, encoded: list[bytes], passed: bytes) -> bytes:
    """``{"ns", "ts", "p", "b"}`` (relay/protocol.py) from entries encoded already."""
    head = bson.encode({"ns": namespace, "ts": last_ts, "p": Binary(passed)})
    body = head[4:-1] + b"\x04b\x00" + _array(encoded)
    return _LENGTH.pack(len(body) + 5) + body + b"\x00"


def _array(encoded: list[bytes]) -> bytes:
    """A BSON array of documents encoded already: each element is type 3, its index as key, the document."""
    inner = b"".join(b"\x03%d\x00%b" % (i, data) for i, data in enumerate(encoded))
    return _LENGTH.pack(len(inner) + 5) + inner + b"\x00"
