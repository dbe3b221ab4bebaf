"""A daemon's cache of the most recent messages of the stream, for catch-up
without a query. Pure: no I/O, tested with plain documents.

It holds consecutive ids only (catch-up indexes it by id), bounded by count
and by payload bytes (50,000 messages of 4,000 four-byte characters would be
800 MB). An entry is a plain tuple (``chat.messages.Encoded``: id, sender,
recipient, created_at, JSON payload) on purpose: the collector stops
tracking an exact tuple of ints, strings, bytes and datetimes once it has
survived one collection, so a full cache adds nothing to the cyclic GC's
full passes. As two objects per message (a dataclass holding a Message), a
50,000-entry cache was 100,000 objects that every full collection walked:
pauses of 50-130 ms in the replay benchmark, every 31,000 or so messages.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator

import orjson

from chat.messages import Encoded, Kind, Message, encode_doc, rfc3339


class RecentCache:
    def __init__(self, max_messages: int, max_bytes: int = 64 << 20):
        self._entries: deque[Encoded] = deque(maxlen=max_messages)  # maxlen 0: no cache, catch-up by query
        self._bytes, self._max_bytes = 0, max_bytes

    @property
    def max_messages(self) -> int:
        return self._entries.maxlen or 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Encoded]:
        return iter(self._entries)

    def covers(self, since: int, upto: int) -> bool:
        """Whether every id in (since, upto] is here."""
        entries = self._entries
        return bool(entries) and entries[0][0] <= since + 1 and entries[-1][0] >= upto

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def extend(self, docs: list[dict], encode: Callable[[dict], Encoded] = encode_doc) -> None:
        for doc in docs:
            self.append(encode(doc))

    def append(self, entry: Encoded) -> None:
        entries = self._entries
        if entries and entry[0] != entries[-1][0] + 1:
            self.clear()  # it must hold consecutive ids only
        if not entries.maxlen:
            return
        if len(entries) == entries.maxlen:
            self._bytes -= len(entries[0][4])  # append() drops it
        entries.append(entry)
        self._bytes += len(entry[4])
        while self._bytes > self._max_bytes and len(entries) > 1:
            self._bytes -= len(entries.popleft()[4])

    def revise(self, event: dict) -> None:
        """An EDIT or DELETE document: the message it names, if held here, is
        held in its latest version from now on, so that no catch-up from the
        cache sends a body its sender replaced or deleted."""
        entries = self._entries
        revision = Message.from_doc(event)  # events are few: the one type costs nothing that counts here
        at = (revision.ref_id or 0) - (entries[0][0] if entries else 0)
        if not entries or not 0 <= at < len(entries):
            return
        msg_id, sender, recipient, created, payload = entries[at]
        if not payload:
            return  # a blank (daemon/passed.py): the message is for none of this daemon's users
        frame = orjson.loads(payload)
        if frame.get("type") != "message":
            return
        if revision.kind == Kind.EDIT:
            if frame.get("deleted"):
                return
            frame["body"], frame["edited_at"] = revision.body, rfc3339(revision.created_at)
        else:
            frame["body"], frame["deleted"] = "", True
        revised = orjson.dumps(frame)
        self._bytes += len(revised) - len(payload)
        entries[at] = (msg_id, sender, recipient, created, revised)

    def between(self, since: int, upto: int) -> list[Encoded]:
        """The entries with since < id <= upto (``covers`` must hold), walked
        from the nearer end: catch-up mostly asks for the newest few, and
        islice from the left would step over up to 50,000 entries (240 us) to
        get there."""
        entries = self._entries
        start, count, n = since + 1 - entries[0][0], upto - since, len(entries)
        if start <= n - start:
            return list(itertools.islice(entries, start, start + count))
        newest_first = list(itertools.islice(reversed(entries), n - start))
        newest_first.reverse()
        return newest_first[:count]
