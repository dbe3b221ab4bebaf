"""Turns what the oplog shows (any order, repeats, holes) into the gap-free
global stream of messages, by id. Pure: no I/O, tested with plain dicts.

Ids are gap-free and visible in id order (writer/message_writer.py). So a repeat is any
id <= high, and a hole is an id above high+1 seen before high+1: the shell
then reads the missing range from the `messages` collection (the truth).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sequencer:
    high: int  # every id <= high has been released, in order
    max_held: int = 10_000  # out-of-order documents kept while a hole is filled
    _held: dict[int, dict] = field(default_factory=dict)
    repeats: int = 0

    def offer(self, docs: list[dict]) -> list[dict]:
        """Returns the documents that can be released now, in id order."""
        if not self._held:
            # The usual batch, the next ids in order, is released as it came:
            # the sort and the checks below cost a tenth of a message's Python.
            high = self.high
            for doc in docs:
                if doc["_id"] != high + 1:
                    break
                high += 1
            else:
                self.high = high
                return docs
        released = []
        for doc in sorted(docs, key=lambda d: d["_id"]):
            i = int(doc["_id"])
            if i <= self.high or i in self._held:
                self.repeats += 1
            elif i == self.high + 1:
                released.append(doc)
                self.high = i
                while (nxt := self.high + 1) in self._held:
                    released.append(self._held.pop(nxt))
                    self.high = nxt
            elif len(self._held) < self.max_held:
                self._held[i] = doc
            # else: dropped; the hole it leaves is read back by query
        return released

    @property
    def hole(self) -> tuple[int, int] | None:
        """(after, upto): ids after < id <= upto are missing, or None."""
        if not self._held:
            return None
        return self.high, max(self._held)

    def offer_truth(self, docs: list[dict]) -> list[dict]:
        """As ``offer``, for documents read from the truth (MySQL): they take
        the place of any held document with the same id."""
        for doc in docs:
            self._held.pop(doc["_id"], None)
        return self.offer(docs)

    def drop_above(self, bound: int) -> list[int]:
        """Forgets held documents with ids past ``bound`` (the highest id the
        truth has committed: anything past it was not written by the writer).
        Returns their ids."""
        dropped = sorted(i for i in self._held if i > bound)
        for i in dropped:
            del self._held[i]
        return dropped

    def skip_to(self, upto: int) -> list[dict]:
        """The range up to ``upto`` was read from the truth and what is missing
        is gone for good (expired). Releases the held documents above it."""
        for i in [i for i in self._held if i <= upto]:
            del self._held[i]
        self.high = max(self.high, upto)
        released = []
        while (nxt := self.high + 1) in self._held:
            released.append(self._held.pop(nxt))
            self.high = nxt
        return released
