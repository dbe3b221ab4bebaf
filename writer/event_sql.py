"""The statements of a batch's events (writer/events.py), run in the writer's
thread inside the batch's transaction: what the rules read first, and what an
accepted event changes beside its own row.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy import Table, func, select, text, tuple_
from sqlalchemy.engine import Connection

from chat.messages import Kind, Message
from db.partition_map import tables_of
from db.sql import device_acks, read_markers
from writer.batch import Pending
from writer.copies import Copy
from writer.events import Facts, Referenced


def has_events(batch: list[Pending]) -> bool:
    return any(p.draft.kind if not isinstance(p.draft, Copy) else p.draft.original.kind for p in batch)


def read_facts(conn: Connection, table: Table, batch: list[Pending], last_id: int) -> Facts:
    """What the rules need of MySQL for ``batch``'s events, in a few reads."""
    facts = Facts(last_id)
    drafts = [p.draft for p in batch if not isinstance(p.draft, Copy) and p.draft.kind]
    refs = {d.ref_id for d in drafts if d.kind in (Kind.EDIT, Kind.DELETE, Kind.READ)}
    if refs:
        rows = conn.execute(select(table.c.id, table.c.sender, table.c.recipient, table.c.kind, table.c.deleted,
                                   table.c.created_at).where(table.c.id.in_(refs))).all()
        facts.refs = {r.id: Referenced(r.sender, r.recipient, r.kind, bool(r.deleted),
                                       r.created_at.replace(tzinfo=UTC)) for r in rows}
    reads = [d for d in drafts if d.kind == Kind.READ]
    if reads:
        pairs = {(d.sender, d.recipient) for d in reads}
        rows = conn.execute(select(read_markers).where(
            tuple_(read_markers.c.reader, read_markers.c.peer).in_(list(pairs)))).all()
        facts.markers = {(r.reader, r.peer): r.upto for r in rows}
        for d in reads:
            upto = d.ref_id or 0
            ref = facts.refs.get(upto)
            if ref is not None and ref.sender == d.sender:  # the reader's own message: the peer's newest below it
                newest = conn.execute(select(func.max(table.c.id)).where(
                    table.c.recipient == d.sender, table.c.sender == d.recipient, table.c.kind == Kind.MESSAGE,
                    table.c.id <= upto)).scalar()
                facts.peer_newest[(d.sender, d.recipient, upto)] = newest or 0
    acks = [d for d in drafts if d.kind == Kind.ACK]
    if acks:
        users = {d.sender for d in acks}
        for r in conn.execute(select(device_acks).where(device_acks.c.user.in_(users))).all():
            facts.devices[(r.user, r.device)] = r.upto
            facts.acked[r.user] = max(facts.acked.get(r.user, 0), r.upto)
        highest: dict[str, int] = defaultdict(int)
        for d in acks:
            highest[d.sender] = max(highest[d.sender], min(d.ref_id or 0, last_id))
        moving = [(user, facts.acked.get(user, 0), upto) for user, upto in highest.items()
                  if upto > facts.acked.get(user, 0)]
        for user, sender, newest in _passed(conn, table, moving):
            facts.passed.setdefault(user, {})[sender] = int(newest)
    return facts


def _passed(conn: Connection, table: Table, moving: list[tuple[str, int, int]]) -> list:
    """(user, peer, newest id) of each peer's messages to each user in (before, upto]: one
    statement for the whole batch (one per user was most of an ack's cost in the writer)."""
    if not moving:
        return []
    params: dict[str, object] = {}
    ranges = []
    for i, (user, before, upto) in enumerate(moving):
        params[f"u{i}"], params[f"b{i}"], params[f"t{i}"] = user, before, upto
        ranges.append(f"SELECT :u{i} AS user, :b{i} AS before_id, :t{i} AS upto_id")
    statement = text(
        f"SELECT m.recipient, m.sender, MAX(m.id) FROM {table.name} m JOIN ({' UNION ALL '.join(ranges)}) r "
        "ON m.recipient = r.user AND m.id > r.before_id AND m.id <= r.upto_id "
        f"WHERE m.kind = {int(Kind.MESSAGE)} AND m.sender <> m.recipient GROUP BY m.recipient, m.sender")
    return list(conn.execute(statement, params).all())


def copy_refs(conn: Connection, partition: int, batch: list[Pending]) -> dict[tuple[int, int], int]:
    """For each event copy in ``batch``: (from_part, ref) -> the same message's id in
    ``partition``. A read or delivery marker names the peer's message, whose
    original is here (its origin); an edit or delete names the sender's, whose
    copy here names it as its origin. Missing: not copied here yet."""
    wanted: dict[int, set[int]] = defaultdict(set)
    for p in batch:
        d = p.draft
        if isinstance(d, Copy) and d.original.kind and d.original.ref_id is not None:
            wanted[d.from_part].add(d.original.ref_id)
    found: dict[tuple[int, int], int] = {}
    here = tables_of(partition).messages
    for from_part, refs in wanted.items():
        there = tables_of(from_part).messages
        rows = conn.execute(select(there.c.id, there.c.origin_part, there.c.origin_id)
                            .where(there.c.id.in_(refs))).all()
        originals = []
        for r in rows:
            if r.origin_part == partition:
                found[(from_part, r.id)] = r.origin_id
            else:
                originals.append(r.id)
        if originals:
            copies = conn.execute(select(here.c.id, here.c.origin_id).where(
                here.c.origin_part == from_part, here.c.origin_id.in_(originals))).all()
            found.update({(from_part, r.origin_id): r.id for r in copies})
    return found


def write_effects(conn: Connection, table: Table, new: list[Message], devices: dict[tuple[str, str], int]) -> None:
    """Beside the rows of a batch: each revision changes the message it names
    (the row holds its latest version), each read moves its marker, and each
    device's position is recorded. All only ever move forward."""
    for m in new:
        if m.kind == Kind.EDIT:
            conn.execute(table.update().where(table.c.id == m.ref_id, table.c.deleted.is_(False))
                         .values(body=m.body, edited_at=m.created_at.replace(tzinfo=None)))
        elif m.kind == Kind.DELETE:
            conn.execute(table.update().where(table.c.id == m.ref_id).values(body="", deleted=True))
    markers = [m for m in new if m.kind == Kind.READ and m.origin_part is None]
    if markers:
        conn.execute(text("INSERT INTO read_markers (reader, peer, upto) VALUES (:reader, :peer, :upto) "
                          "ON DUPLICATE KEY UPDATE upto = GREATEST(upto, VALUES(upto))"),
                     [{"reader": m.sender, "peer": m.recipient, "upto": m.ref_id} for m in markers])
    if devices:
        now = datetime.now(UTC).replace(tzinfo=None)
        conn.execute(text("INSERT INTO device_acks (user, device, upto, acked_at) VALUES (:user, :device, :upto, :at) "
                          "ON DUPLICATE KEY UPDATE upto = GREATEST(upto, VALUES(upto)), acked_at = VALUES(acked_at)"),
                     [{"user": u, "device": d, "upto": upto, "at": now} for (u, d), upto in devices.items()])

