"""Partitions, pure: which users a partition holds, and what a cursor may resume.

A user's *slot* is a stable hash of the user id into ``SLOTS`` slots; the
*slot map* gives each slot to one of ``partitions`` partitions. Every
partition is a cell of its own: its own gap-free sequence of ids, its own
writer lock, its own tables and fast-store collection, and its own stream.
Partition 0's objects keep the unpartitioned names (``messages``,
``chat.writer``), so a deployment of one partition is the single stream.

The map only changes by moving slots, and every move raises its *epoch*; a
slot remembers the epoch of its last move. A cursor carries (partition,
epoch, position): it resumes only where it was made, and only if its user's
slot has not moved since. Anything else is ``None``: the client is told
``recovered: false`` rather than given a silent gap.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

# Fixed for the life of a deployment: slots are what moves, so partitions can
# grow (up to this many) without rehashing users.
SLOTS = 1024
MAX_PARTITIONS = 64
# The longest position a cursor may carry: a BIGINT.
_POSITION_DIGITS = 19


class BadPartitions(ValueError):
    """A partition list or slot map that cannot be used (the message says why)."""


def slot_of(user: str) -> int:
    """The user's slot: CRC-32 of its UTF-8 bytes, the same on every host and in every language."""
    return zlib.crc32(user.encode()) % SLOTS


def suffix(partition: int) -> str:
    """The suffix of a partition's tables, collection and lock: none for partition 0."""
    return "" if partition == 0 else f"_p{partition}"


def collection_name(partition: int) -> str:
    return "messages" + suffix(partition)


def lock_name(partition: int) -> str:
    return "chat.writer" if partition == 0 else f"chat.writer.p{partition}"


# A session of the mover that holds writer locks also holds the named lock of this prefix and
# its own connection id, so that a writer whose lock wait runs out can tell a move's hold (waited
# for longer: the move ends it) from another writer's that hangs (answered partition_busy).
MOVER_MARK = "chat.mover."


@dataclass(frozen=True, slots=True)
class SlotMap:
    """Slot -> partition (``owner``), and the epoch each slot last moved at (``moved``, 0: never)."""

    epoch: int
    partitions: int
    owner: tuple[int, ...]
    moved: tuple[int, ...]

    @classmethod
    def even(cls, partitions: int) -> SlotMap:
        """Contiguous, equal ranges of slots: slot ``s`` in partition ``s * partitions // SLOTS``."""
        _check_count(partitions)
        return cls(0, partitions, tuple(s * partitions // SLOTS for s in range(SLOTS)), (0,) * SLOTS)

    def partition_of(self, user: str) -> int:
        return self.owner[slot_of(user)]

    def slots_of(self, partition: int) -> list[int]:
        return [s for s, p in enumerate(self.owner) if p == partition]

    def move(self, slots: Iterable[int], to: int) -> SlotMap:
        """The map with ``slots`` given to partition ``to``, at the next epoch (slots already there stay put)."""
        if not 0 <= to < MAX_PARTITIONS:
            raise BadPartitions(f"partition {to} is outside 0..{MAX_PARTITIONS - 1}")
        epoch = self.epoch + 1
        owner, moved = list(self.owner), list(self.moved)
        for s in slots:
            if not 0 <= s < SLOTS:
                raise BadPartitions(f"slot {s} is outside 0..{SLOTS - 1}")
            if owner[s] != to:
                owner[s], moved[s] = to, epoch
        return SlotMap(epoch, max(self.partitions, to + 1), tuple(owner), tuple(moved))

    def grown(self, partitions: int) -> SlotMap:
        """The map with ``partitions`` partitions, slots laid out as ``even`` would: only the slots whose
        partition changes move (and only their users' cursors stop resuming)."""
        _check_count(partitions)
        target = SlotMap.even(partitions).owner
        epoch = self.epoch + 1
        moved = tuple(epoch if target[s] != self.owner[s] else self.moved[s] for s in range(SLOTS))
        return SlotMap(epoch, partitions, target, moved)

    def encode(self) -> str:
        """Compact JSON (runs of equal values), as MySQL keeps it."""
        return orjson.dumps({"epoch": self.epoch, "partitions": self.partitions,
                             "owner": _runs(self.owner), "moved": _runs(self.moved)}).decode()

    @classmethod
    def decode(cls, text: str) -> SlotMap:
        try:
            doc = orjson.loads(text)
            epoch, partitions = int(doc["epoch"]), int(doc["partitions"])
            owner, moved = _unrun(doc["owner"]), _unrun(doc["moved"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise BadPartitions(f"slot map is not readable: {exc}") from None
        _check_count(partitions)
        if len(owner) != SLOTS or len(moved) != SLOTS:
            raise BadPartitions(f"slot map must cover {SLOTS} slots")
        if any(not 0 <= p < partitions for p in owner) or any(not 0 <= e <= epoch for e in moved):
            raise BadPartitions("slot map names a partition or an epoch it does not have")
        return cls(epoch, partitions, owner, moved)


def _check_count(partitions: int) -> None:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise BadPartitions(f"partitions must be 1..{MAX_PARTITIONS}, not {partitions}")


def _runs(values: tuple[int, ...]) -> list[list[int]]:
    runs: list[list[int]] = []
    for i, v in enumerate(values):
        if runs and runs[-1][2] == v:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, v])
    return runs


def _unrun(runs: list[list[int]]) -> tuple[int, ...]:
    out: list[int] = []
    for start, end, value in runs:
        if start != len(out) or end <= start:
            raise ValueError("runs must be contiguous")
        out.extend([int(value)] * (end - start))
    return tuple(out)


def parse_served(raw: str, partitions: int) -> frozenset[int]:
    """A daemon's ``CHAT_DAEMON_PARTITIONS`` as the set of partitions it serves under a map of
    ``partitions``: "" = all; "0,2" = those; "%2=0" = every k with k mod 2 = 0, so that the
    partitions a grow adds are served too, by a rule every host and the proxy share."""
    text = raw.strip()
    if not text:
        return frozenset(range(partitions))
    if text.startswith("%"):
        modulus, _, rest = text[1:].partition("=")
        if not (modulus.strip().isdecimal() and rest.strip().isdecimal()) or not 0 <= int(rest) < int(modulus):
            raise BadPartitions(f"served partitions {raw!r}: a rule reads %N=R, with 0 <= R < N")
        n, r = int(modulus), int(rest)
        if r >= partitions:
            raise BadPartitions(f"served partitions {raw!r}: none of the map's {partitions}")
        return frozenset(k for k in range(partitions) if k % n == r)
    served: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        if not item.isdecimal() or not 0 <= int(item) < partitions:
            raise BadPartitions(f"served partition {item!r} is not one of 0..{partitions - 1}")
        served.add(int(item))
    return frozenset(served)


@dataclass(frozen=True, slots=True)
class Cursor:
    """A resume point. ``partition`` None: a bare message id, read in the user's partition of today."""

    partition: int | None
    epoch: int
    position: int

    def encode(self) -> str:
        # Partition 0 at epoch 0 is the single stream's cursor: a bare id, as every message id is.
        if self.partition in (None, 0) and self.epoch == 0:
            return str(self.position)
        return f"{self.partition}.{self.epoch}.{self.position}"


def parse_cursor(raw: str | None) -> Cursor | None:
    """``since`` as a Cursor: a decimal id, or "partition.epoch.position"; None if absent or malformed."""
    if not raw:
        return None
    parts = raw.split(".")
    if len(parts) not in (1, 3) or not all(p.isdecimal() and p.isascii() and len(p) <= _POSITION_DIGITS
                                           for p in parts):
        return None
    if len(parts) == 1:
        return Cursor(None, 0, int(parts[0]))
    partition, epoch, position = (int(p) for p in parts)
    return Cursor(partition, epoch, position) if partition < MAX_PARTITIONS else None


def resume_position(cursor: Cursor | None, user: str, slot_map: SlotMap) -> int | None:
    """Where ``user`` resumes in its partition, or None (``recovered: false``): the cursor was made in
    another partition, or the user's slot moved after it was made."""
    if cursor is None:
        return None
    slot = slot_of(user)
    if cursor.partition is None:
        return cursor.position if slot_map.moved[slot] == 0 else None
    if cursor.partition != slot_map.owner[slot] or slot_map.moved[slot] > cursor.epoch:
        return None
    return cursor.position


class LiveMap:
    """The slot map a process routes and reads by now. A move's cutover writes a map of the
    next epoch (``chatctl partitions move``); each process adopts it when it reads it: the
    writers under their partition's lock at each turn, the API and daemons by a watch. A map
    is replaced, never changed, so a reader that took ``current`` keeps one consistent map."""

    __slots__ = ("current",)

    def __init__(self, current: SlotMap):
        self.current = current

    def adopt(self, found: SlotMap) -> bool:
        """Takes ``found`` if it is newer; whether it was."""
        if found.epoch <= self.current.epoch:
            return False
        self.current = found
        return True
