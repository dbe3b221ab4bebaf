"""Frames between the host's oplog relay and its daemons (a Unix socket).

A frame is one BSON document: BSON starts with its own length (int32, little
endian), so it needs no header of ours, and oplog entries keep their types
(Timestamp ``ts``, datetimes) with no conversion either way.

daemon -> relay, once:  ``{"since": Timestamp | None, "ns": [str, ...],
                        "users": {ns: [user, ...]}, "name": str}``:
                        the ``ts`` of the last entry the daemon has, and
                        the namespaces (its partitions' collections) it
                        wants; without ``ns``, every namespace the relay
                        tails. With ``users`` (routed by user), the users it
                        holds in each; without, it takes whole namespaces.
                        ``name``: its label in the relay's metrics.
daemon -> relay, then:  routed by user only: ``{"sub": [user], "ns": ns,
                        "n": int}``, a user's first connection (``n``
                        numbers it); ``{"unsub": [user], "ns": ns}``, its last
relay -> daemon:        ``{"resumed": bool}``: true, every entry after
                        ``since`` follows; false, some may be missing
                        ``{"b": [entry, ...]}``: the entries of one oplog
                        batch in one namespace, in order (a batch of
                        several namespaces is one such frame each), each
                        with only the fields a daemon reads (``slim``)
                        routed by user, ``{"ns", "ts", "p", "b"}``: of one
                        namespace's part, the entries for the daemon's
                        users, the part's last ``ts``, and ``p``, the (id,
                        digest) of every other message document
                        (relay/routing.py)
                        ``{"subbed": n, "ns": ns}``: the subscriptions up to
                        ``n`` apply from here on in this stream
                        ``{"restarted": true}``: the relay's own tail re-opened
                        and may have missed entries

Nothing here is needed for correctness: a daemon treats an entry it never
got as it does on a tail of its own, as a hole in the ids, read back from
MySQL or the `messages` collection.
"""

from __future__ import annotations

import asyncio
import struct

import bson
from bson.codec_options import CodecOptions
from bson.errors import BSONError

from chat.frames import BadFrame, read_sized
from oplog.events import ENTRY_FIELDS

LENGTH = struct.Struct("<i")
# A batch is at most one getMore reply (16 MB on MongoDB) plus our key.
FRAME_MAX = 32 << 20
# A hello names the users a daemon holds: some 20 bytes each, 18,000 connections at most.
HELLO_MAX = 4 << 20
REQUEST_MAX = 64 << 10  # a sub or unsub: a few users
_ENTRY_KEYS = frozenset(ENTRY_FIELDS)


def slim(entry: dict) -> dict:
    """An oplog entry as a daemon gets it: only ``oplog.events.ENTRY_FIELDS``. The rest is
    left out of the frames: FerretDB's ObjectId _id and the `wall` datetime alone took two
    thirds of a daemon's BSON decode of an entry (6.3 against 18.2 us, measured), in every
    daemon. The relay's own tail asks for those fields only, and such an entry is returned as
    it is: a copy of each would cost about a twentieth of the relay's CPU per entry. Another
    source may not ask."""
    if entry.keys() <= _ENTRY_KEYS:
        return entry
    return {k: entry[k] for k in ENTRY_FIELDS if k in entry}


def frame(doc: dict) -> bytes:
    return bson.encode(doc)


async def read_frame(reader: asyncio.StreamReader, limit: int, codec: CodecOptions) -> dict | None:
    """The next document, or None at a clean end of stream."""
    data = await read_sized(reader, LENGTH, limit, length_included=True)
    if data is None:
        return None
    try:
        return bson.decode(data, codec_options=codec)
    except BSONError as exc:
        raise BadFrame(f"not BSON: {exc}") from None
