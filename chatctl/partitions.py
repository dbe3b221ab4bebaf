"""``chatctl partitions show``, ``grow N``, ``move SLOTS --to K`` and ``resume``: the slot map in MySQL.

Growing and moving are online (docs/operations.md, "Partitions"): the
moving users' history is copied into their new partition while everything
serves, then a cutover of a fraction of a second (the writer locks of the
partitions involved) writes the map of the next epoch. Every process adopts
it by itself. The move is kept in MySQL step by step: a mover that dies is
rerun (``resume``, or the same command) and goes on from where it stood.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from chat.moves import MovePlan
from chat.partitions import MAX_PARTITIONS, SLOTS, BadPartitions, SlotMap
from chat.settings import Settings
from db import mongo
from db.mover import PAGE, Mover, MoveRefused, begin, read_progress
from db.partition_map import NoSlotMap, ensure_tables, read_slot_map


# The new partitions' collections are made before anything moves, so a slow fast store costs only
# the operator's wait: each attempt may take this long, and a store that answers none of them
# refuses the move with nothing moved. An overloaded FerretDB has taken longer than the
# processes' own bound (`stores.db_timeout_seconds`) to answer a create_collection.
STORE_ATTEMPTS = 4
STORE_ATTEMPT_SECONDS = 30.0


def _say(line: str) -> None:
    print(line, flush=True)  # a step at a time, as it happens: the operator watches a long copy


class ChangeRefused(Exception):
    """What the operator must do first (the message says)."""


def describe(slot_map: SlotMap) -> str:
    """The map for an operator: its epoch, its partitions, and each one's slots as ranges."""
    lines = [f"epoch {slot_map.epoch}, {slot_map.partitions} partition{'s' if slot_map.partitions != 1 else ''}"]
    for k in range(slot_map.partitions):
        slots = slot_map.slots_of(k)
        lines.append(f"partition {k}: {len(slots)} slots {_ranges(slots)}".rstrip())
    return "\n".join(lines)


def _ranges(slots: list[int]) -> str:
    runs: list[list[int]] = []
    for s in slots:
        if runs and runs[-1][1] == s - 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def check_growth(current: SlotMap, partitions: int) -> None:
    if partitions <= current.partitions:
        raise ChangeRefused(f"the store has {current.partitions} partitions: grow to more (partitions never shrink)")
    if partitions > MAX_PARTITIONS:
        raise ChangeRefused(f"at most {MAX_PARTITIONS} partitions")


def show(settings: Settings) -> str:
    engine = create_engine(settings.stores.mysql_url.get_secret_value())
    try:
        with engine.connect() as conn:
            shown = describe(_current(conn))
            progress = read_progress(conn)
        if progress is not None:
            plan = progress.plan
            shown += (f"\nmove in progress to epoch {plan.after.epoch}: {len(plan.moving)} slots from partitions "
                      f"{_list(plan.sources)} to {_list(plan.targets)}, copied up to ids "
                      + ", ".join(f"{k}: {v}" for k, v in sorted(progress.copied.items()))
                      + " (`chatctl partitions resume` finishes it)")
        return shown
    finally:
        engine.dispose()


def grow(settings: Settings, partitions: int, report: Callable[[str], None] = _say, page: int = PAGE,
         store_wait: float = STORE_ATTEMPT_SECONDS) -> str:
    """Grows the map to ``partitions`` online; returns the new map described."""
    def plan(current: SlotMap) -> MovePlan:
        check_growth(current, partitions)
        return MovePlan(current, current.grown(partitions))
    return _move(settings, plan, report, page, store_wait)


def move(settings: Settings, slots: list[int], to: int, report: Callable[[str], None] = _say,
         page: int = PAGE, store_wait: float = STORE_ATTEMPT_SECONDS) -> str:
    """Moves ``slots`` to partition ``to`` (a new partition, if it is the next one) online."""
    def plan(current: SlotMap) -> MovePlan:
        if not 0 <= to <= min(current.partitions, MAX_PARTITIONS - 1):
            raise ChangeRefused(f"partition {to} is not one of 0..{current.partitions} (the next one is made)")
        try:
            after = current.move(slots, to)
        except BadPartitions as exc:
            raise ChangeRefused(str(exc)) from None
        if after.owner == current.owner:
            raise ChangeRefused(f"slots {_ranges(sorted(set(slots)))} are in partition {to} already")
        return MovePlan(current, after)
    return _move(settings, plan, report, page, store_wait)


def prepare(settings: Settings, partitions: int, report: Callable[[str], None] = _say) -> str:
    """Creates the tables and collections of ``partitions`` partitions (those that exist stay)."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ChangeRefused(f"partitions are 1..{MAX_PARTITIONS}")
    engine = create_engine(settings.stores.mysql_url.get_secret_value())
    try:
        ensure_tables(engine, partitions)
        _ensure_collections(settings, partitions, report, STORE_ATTEMPT_SECONDS)
    finally:
        engine.dispose()
    return (f"tables and collections of partitions 0..{partitions - 1} exist: run deploy/mysql/grants.sql, "
            f"then `chatctl partitions grow {partitions}`")


def resume(settings: Settings, report: Callable[[str], None] = _say, page: int = PAGE,
           store_wait: float = STORE_ATTEMPT_SECONDS) -> str:
    """Finishes the move in progress (a mover that died)."""
    return _move(settings, None, report, page, store_wait)


def parse_slots(text: str) -> list[int]:
    """``0-99,512`` as a list of slots."""
    slots: list[int] = []
    for item in text.split(","):
        low, _, high = item.strip().partition("-")
        if not low.isdecimal() or (high and not high.isdecimal()):
            raise ChangeRefused(f"slots are numbers or ranges like 0-99,512, not {item!r}")
        first, last = int(low), int(high or low)
        if not 0 <= first <= last < SLOTS:
            raise ChangeRefused(f"slots are 0..{SLOTS - 1}: {item!r}")
        slots.extend(range(first, last + 1))
    return slots


def _move(settings: Settings, planned: Callable[[SlotMap], MovePlan] | None, report: Callable[[str], None],
          page: int, store_wait: float) -> str:
    # the cutover holds every involved partition's queue lock on a session of its own, at once
    engine = create_engine(settings.stores.mysql_url.get_secret_value(), max_overflow=MAX_PARTITIONS)
    mover = None
    try:
        with engine.connect() as conn:
            current = _current(conn)
            in_progress = read_progress(conn)
        if planned is None:
            if in_progress is None:
                raise ChangeRefused("no move is in progress")
            plan = in_progress.plan
        elif in_progress is not None:
            plan = in_progress.plan
            if plan != planned(plan.before):
                raise ChangeRefused(f"another move (to epoch {plan.after.epoch}) is in progress: "
                              "run `chatctl partitions resume` first")
        else:
            plan = planned(current)
        ensure_tables(engine, plan.after.partitions)
        _ensure_collections(settings, plan.after.partitions, report, store_wait)
        progress = begin(engine, plan)
        moving = plan.moving
        report(f"moving {len(moving)} slots from partitions {_list(plan.sources)} to {_list(plan.targets)} "
               f"(epoch {plan.before.epoch} -> {plan.after.epoch})"
               + (f"; resuming after ids {progress.copied}" if any(progress.copied.values()) else ""))
        stores = settings.stores
        mover = Mover(engine, stores.mongo_url.get_secret_value(), stores.mongo_db, stores.retention_seconds,
                      stores.db_timeout_seconds, report, page)
        return describe(mover.run(progress))
    except MoveRefused as exc:
        raise ChangeRefused(str(exc)) from None
    finally:
        if mover is not None:
            mover.close()
        engine.dispose()


def _list(parts: list[int]) -> str:
    return ",".join(map(str, parts))


def _current(conn: Connection) -> SlotMap:
    slot_map = read_slot_map(conn)
    if slot_map is None:
        raise NoSlotMap("MySQL holds no slot map: run `python -m db.init` first")
    return slot_map


def _ensure_collections(settings: Settings, partitions: int, report: Callable[[str], None],
                        attempt_seconds: float) -> None:
    """The fast store's collections of ``partitions`` partitions, waiting for a slow store (``STORE_ATTEMPTS``)."""
    for attempt in range(1, STORE_ATTEMPTS + 1):
        try:
            asyncio.run(_ensure_schema(settings, partitions, attempt_seconds))
            return
        except PyMongoError as exc:
            report(f"the fast store did not make the partitions' collections within {attempt_seconds:g} s "
                   f"({exc.__class__.__name__}; attempt {attempt} of {STORE_ATTEMPTS})")
    raise ChangeRefused(f"the fast store answered none of {STORE_ATTEMPTS} attempts: nothing has moved; "
                        "run the command again once it answers")


async def _ensure_schema(settings: Settings, partitions: int, timeout_seconds: float) -> None:
    # timeoutMS bounds each operation whole (server selection, connecting, the answer): an attempt's bound
    client: AsyncMongoClient = AsyncMongoClient(settings.stores.mongo_url.get_secret_value(), tz_aware=True,
                                                timeoutMS=int(timeout_seconds * 1000))
    try:
        stores = settings.stores
        await mongo.ensure_schema(client, stores.mongo_db, stores.retention_seconds, stores.oplog_max_docs,
                                  stores.oplog_size_bytes, partitions)
    finally:
        await client.close()
