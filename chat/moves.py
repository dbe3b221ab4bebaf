"""Moving slots between partitions while they serve, pure: what a move copies, and where.

A move takes slots from the partitions that own them (its *sources*) to others
(its *targets*). A user's partition must hold every row of theirs: so before a
moved user's slot changes owner, every row of theirs in the source (messages
they sent or got, and the events of those conversations) is copied into the
target, with the target's own ids, keyed by the row's *origin* (the original's
partition and id) so that a row is copied into a partition once, however often
a move is rerun. The copy then catches up with what arrived meanwhile, and the
cutover (writer locks of the sources and targets held: a pause of those
partitions' writes only) copies the last rows and writes the map of the next
epoch. docs/decisions/online-moves.md says why it is built this way.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from chat.messages import Message
from chat.partitions import BadPartitions, SlotMap, slot_of


@dataclass(frozen=True, slots=True)
class MovePlan:
    """The map before the move and the map it cuts over to (the next epoch)."""

    before: SlotMap
    after: SlotMap

    def __post_init__(self) -> None:
        if self.after.epoch != self.before.epoch + 1:
            raise BadPartitions(f"a move goes from epoch {self.before.epoch} to the next, not {self.after.epoch}")

    @property
    def moving(self) -> list[int]:
        """The slots whose owner changes."""
        return [s for s in range(len(self.before.owner)) if self.before.owner[s] != self.after.owner[s]]

    def leaving(self, source: int) -> list[int]:
        """The slots that leave ``source``."""
        return [s for s in self.moving if self.before.owner[s] == source]

    @property
    def sources(self) -> list[int]:
        return sorted({self.before.owner[s] for s in self.moving})

    @property
    def targets(self) -> list[int]:
        return sorted({self.after.owner[s] for s in self.moving})

    def moves(self, user: str) -> bool:
        slot = slot_of(user)
        return self.before.owner[slot] != self.after.owner[slot]

    def encode(self) -> str:
        return orjson.dumps({"before": self.before.encode(), "after": self.after.encode()}).decode()

    @classmethod
    def decode(cls, text: str) -> MovePlan:
        try:
            doc = orjson.loads(text)
            return cls(SlotMap.decode(doc["before"]), SlotMap.decode(doc["after"]))
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise BadPartitions(f"the move in progress is not readable: {exc}") from None


def origin_of(row: Message, partition: int) -> tuple[int, int]:
    """Where a row of ``partition`` was first written: its own (partition, id) if it is an original."""
    if row.origin_part is None or row.origin_id is None:
        return partition, row.id
    return row.origin_part, row.origin_id


def copy_targets(row: Message, source: int, plan: MovePlan) -> list[int]:
    """The partitions a row of ``source`` must be copied into: those its sender and recipient
    move to, each if they live in ``source`` now and it is not where the row was first written
    (the original is there already; a copy of it elsewhere is found by its origin)."""
    first_written = origin_of(row, source)[0]
    targets = set()
    for user in (row.sender, row.recipient):
        slot = slot_of(user)
        if plan.before.owner[slot] == source and plan.after.owner[slot] != source:
            targets.add(plan.after.owner[slot])
    targets.discard(first_written)
    return sorted(targets)


@dataclass(slots=True)
class Progress:
    """How far a move has copied: each source's rows up to ``copied[source]`` are copied."""

    plan: MovePlan
    copied: dict[int, int]

    def encode(self) -> str:
        copied = {str(k): v for k, v in self.copied.items()}
        return orjson.dumps({"plan": self.plan.encode(), "copied": copied}).decode()

    @classmethod
    def decode(cls, text: str) -> Progress:
        try:
            doc = orjson.loads(text)
            return cls(MovePlan.decode(doc["plan"]), {int(k): int(v) for k, v in doc["copied"].items()})
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise BadPartitions(f"the move in progress is not readable: {exc}") from None

    @classmethod
    def start(cls, plan: MovePlan) -> Progress:
        return cls(plan, dict.fromkeys(plan.sources, 0))
