"""Turns what the oplog shows (any order, repeats, holes) into the gap-free
global stream of messages, by id. Pure: no I/O, tested with plain dicts.

Ids are gap-free and visible in id order (writer/message_writer.py). So a repeat is any
id <= high, and a hole is an id above high+1 seen before high+1: the shell
then reads the missing range from the stores (MySQL, the truth; else the
`messages` collection of the fast store).

The fast store is not the truth: anyone may put a document at the next id
before the writer does. So a document is released only up to ``bound``, the
highest id whose document the shell has checked against MySQL; past it,
documents are held as if above a hole, until the shell confirms them
(``bound`` moves) or MySQL's rows take their place (``offer_truth``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Sequencer:
    high: int  # every id <= high has been released, in order
    max_held: int = 10_000  # out-of-order documents kept while a hole is filled
    # The highest id whose document may be released; None: no bound (a stream
    # without MySQL). Only the shell moves it, after a read of MySQL.
    bound: int | None = None
    _held: dict[int, dict] = field(default_factory=dict)
    repeats: int = 0

    def offer(self, docs: list[dict]) -> list[dict]:
        """Returns the documents that can be released now, in id order."""
        bound = self.bound
        if not self._held and (bound is None or bound - self.high >= len(docs)):
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
            elif i == self.high + 1 and (bound is None or i <= bound):
                released.append(doc)
                self.high = i
                released += self.release()
            elif len(self._held) < self.max_held:
                self._held[i] = doc
            # else: dropped; the hole it leaves is read back by query
        return released

    def confirm(self, upto: int) -> list[dict]:
        """MySQL vouches for every document up to ``upto``: the bound moves
        there, and the held documents it now covers are released."""
        if self.bound is not None and upto > self.bound:
            self.bound = upto
        return self.release()

    def release(self) -> list[dict]:
        """The held documents that follow ``high`` without a hole, up to ``bound``."""
        released = []
        while (nxt := self.high + 1) in self._held and (self.bound is None or nxt <= self.bound):
            released.append(self._held.pop(nxt))
            self.high = nxt
        return released

    @property
    def hole(self) -> tuple[int, int] | None:
        """(after, upto): ids after < id <= upto need a read of the stores
        (missing, or held past ``bound`` until MySQL confirms them), or None."""
        if not self._held:
            return None
        return self.high, max(self._held)

    @property
    def held(self) -> int:
        """How many documents are held."""
        return len(self._held)

    def held_ids(self) -> list[int]:
        return list(self._held)

    def held_upto(self, upto: int) -> list[dict]:
        """The held documents with ids up to ``upto``, in id order."""
        return [self._held[i] for i in sorted(self._held) if i <= upto]

    def offer_truth(self, docs: list[dict]) -> list[dict]:
        """As ``offer``, for documents read from MySQL, the truth: they take
        the place of any held document with the same id, and the bound moves
        up to the last of them."""
        for doc in docs:
            self._held.pop(doc["_id"], None)
        if docs and self.bound is not None:
            self.bound = max(self.bound, max(int(d["_id"]) for d in docs))
        # held documents the new bound covers (ids MySQL lacks, which the shell
        # takes from the collection) follow them
        return self.offer(docs) + self.release()

    def drop_above(self, bound: int) -> list[int]:
        """Forgets held documents with ids past ``bound`` (the highest id
        MySQL has committed: anything past it was not written by the writer).
        Returns their ids."""
        dropped = sorted(i for i in self._held if i > bound)
        for i in dropped:
            del self._held[i]
        return dropped

    def forget(self, upto: int, which: Callable[[dict], bool]) -> list[int]:
        """Forgets the held documents with ids up to ``upto`` that ``which``
        picks: each id is a hole again, and what fills it takes its place.
        Returns their ids."""
        gone = sorted(i for i, doc in self._held.items() if i <= upto and which(doc))
        for i in gone:
            del self._held[i]
        return gone

    def skip_to(self, upto: int) -> list[dict]:
        """The range up to ``upto`` was read (from MySQL, or the `messages`
        collection) and what is missing from it is gone for good (expired or
        deleted). Releases the held documents above it, up to ``bound``."""
        for i in [i for i in self._held if i <= upto]:
            del self._held[i]
        self.high = max(self.high, upto)
        return self.release()
