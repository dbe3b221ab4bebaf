"""Ids a relay routed by user passed over: message documents of this
daemon's partition for none of its users (relay/routing.py). Pure.

Each stands in the sequencer (daemon/sequencer.py) for the document it
replaces, as a ``Passed``: it takes its id's place in the order, so the
position moves past it and a hole is still a hole, and its digest takes the
document's place in the check against MySQL (daemon/stream_fills.py), so a
range is confirmed as a whole. It is never delivered, and the recent cache
keeps a blank in its place (``BLANK``), which no user's catch-up matches.
"""

from __future__ import annotations

from datetime import UTC, datetime
from operator import itemgetter

from chat.messages import Encoded, shown_digest
from relay.routing import PASSED


class Passed(dict):
    """An id passed over, and the digest of its document: ``{"_id": id}``
    as the sequencer reads it. Only the relay's frames make one (a type, not
    a key: a document of the fast store cannot pass for one)."""

    __slots__ = ("digest",)

    def __init__(self, msg_id: int, digest: int):
        super().__init__(_id=msg_id)
        self.digest = digest


def passed_over(packed: bytes) -> list[Passed]:
    """The ``Passed`` of a batch's packed (id, digest) pairs, in order.

    Each daemon makes one for every message of its partitions that none of its users
    is in: at six daemons a host, five per message. So each is made and filled in place,
    not through ``__init__``, a Python call that took 0.36 µs an id against 0.16."""
    out: list[Passed] = []
    append, new = out.append, dict.__new__
    for msg_id, digest in PASSED.iter_unpack(packed):
        passed = new(Passed)
        passed["_id"] = msg_id
        passed.digest = digest
        append(passed)
    return out


def merged(docs: list[dict], passed: list[Passed]) -> list[dict]:
    """Both in id order (each is already, as the oplog holds them): the sequencer's quick path takes it whole."""
    if not docs:
        return passed  # type: ignore[return-value]  # a Passed is a dict
    if not passed:
        return docs
    return sorted([*docs, *passed], key=_ID)


_ID = itemgetter("_id")  # the sort's key in C: half the cost of a Python function per element


def digest(doc: dict) -> int:
    """What a document shows (``chat.messages.shown_digest``), or the relay's digest of a ``Passed``'s."""
    return doc.digest if type(doc) is Passed else shown_digest(doc)


def digest_of(docs: list[dict]) -> int:
    """The digests of ``docs`` combined as MySQL combines its rows' (``chat.messages.shown_digest_of``)."""
    combined = 0
    for doc in docs:
        combined ^= digest(doc)
    return combined


_NOBODY = datetime(1970, 1, 1, tzinfo=UTC)


def blank(msg_id: int) -> Encoded:
    """The recent cache's entry for an id passed over: it keeps the cache's
    ids consecutive, and matches no user's catch-up (no user is "")."""
    return msg_id, "", "", _NOBODY, b""
