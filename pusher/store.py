"""The pusher's SQL, each function run on the thread of its partition's lease
connection (``pusher.process``), inside what that connection holds: the
partition's pusher lock."""

from __future__ import annotations

from datetime import datetime

import orjson
from sqlalchemy import func, literal, select, text, tuple_
from sqlalchemy.engine import Connection

from chat.messages import Message
from chat.partitions import lock_name
from db import conversation_state
from db.partition_map import tables_of
from db.sql import device_acks, devices, push_outbox, push_state, read_markers
from pusher.core import Device, Notification

PAGE = 1000  # rows of the stream decided per step at most


def lease_name(partition: int) -> str:
    return lock_name(partition) + ".pusher"


def take_lease(conn: Connection, partition: int) -> bool:
    """The partition's pusher lock, if nobody holds it (no wait: another host's pusher has it)."""
    got = conn.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": lease_name(partition)}).scalar()
    conn.commit()
    return got == 1


def still_held(conn: Connection, partition: int) -> bool:
    held = conn.execute(text("SELECT IS_USED_LOCK(:n) = CONNECTION_ID()"), {"n": lease_name(partition)}).scalar()
    conn.commit()
    return bool(held)


def start_position(conn: Connection, partition: int) -> int:
    """Where the pusher of ``partition`` goes on from; a first start begins at the newest row (no history is pushed)."""
    messages = tables_of(partition).messages
    newest = conn.execute(select(func.coalesce(func.max(messages.c.id), 0))).scalar_one()
    conn.execute(text("INSERT IGNORE INTO push_state (id, upto) VALUES (:k, :upto)"), {"k": partition, "upto": newest})
    upto = conn.execute(select(push_state.c.upto).where(push_state.c.id == partition)).scalar_one()
    conn.commit()
    return int(upto)


def rows_after(conn: Connection, partition: int, after: int, with_body: bool) -> list[Message]:
    """The next PAGE rows, with what the pusher decides on (the columns it
    leaves out keep Message's defaults); their bodies only when a notification
    may carry one (CHAT_PUSH_CONTENT=full)."""
    messages = tables_of(partition).messages
    body = messages.c.body if with_body else literal("").label("body")
    found = conn.execute(select(messages.c.id, messages.c.sender, messages.c.recipient, body,
                                messages.c.created_at, messages.c.kind, messages.c.deleted)
                         .where(messages.c.id > after).order_by(messages.c.id).limit(PAGE)).all()
    conn.commit()
    return [Message.from_row(r) for r in found]


def what_they_have(conn: Connection, users: set[str], pairs: set[tuple[str, str]]
                   ) -> tuple[dict[str, int], dict[tuple[str, str], int], dict[str, list[Device]]]:
    """Each user's highest acknowledged position, their read markers, and their registered devices."""
    acked = {u: int(upto) for u, upto in conn.execute(
        select(device_acks.c.user, func.max(device_acks.c.upto)).where(device_acks.c.user.in_(users))
        .group_by(device_acks.c.user)).all()}
    read = {(r.reader, r.peer): int(r.upto) for r in conn.execute(
        select(read_markers).where(tuple_(read_markers.c.reader, read_markers.c.peer).in_(list(pairs)))).all()}
    registered: dict[str, list[Device]] = {}
    for r in conn.execute(select(devices).where(devices.c.user.in_(users)).order_by(devices.c.device)).all():
        registered.setdefault(r.user, []).append(Device(r.user, r.device, r.app_id, r.pushkey, orjson.loads(r.data)))
    conn.commit()
    return acked, read, registered


def devices_of(conn: Connection, users: set[str]) -> dict[str, list[Device]]:
    return what_they_have(conn, users, set())[2]


def unread_totals(conn: Connection, partition: int, users: set[str]) -> dict[str, int]:
    totals = conversation_state.unread_totals(conn, partition, users)
    conn.commit()
    return totals


def decided(conn: Connection, partition: int, upto: int, notes: list[Notification], now: datetime) -> None:
    """In one transaction: the notifications of the rows up to ``upto``, and the position past them."""
    stamp = now.replace(tzinfo=None)
    if notes:
        conn.execute(push_outbox.insert().prefix_with("IGNORE"), [
            {"key": n.key, "partition": partition, "user": n.user, "device": n.device,
             "notification": orjson.dumps(n.request).decode(), "created_at": stamp, "attempts": 0, "next_at": stamp}
            for n in notes])
    conn.execute(push_state.update().where(push_state.c.id == partition).values(upto=upto))
    conn.commit()


def outbox_due(conn: Connection, partition: int, now: datetime, limit: int) -> list:
    rows = conn.execute(select(push_outbox).where(push_outbox.c.partition == partition,
                                                  push_outbox.c.next_at <= now.replace(tzinfo=None))
                        .order_by(push_outbox.c.next_at).limit(limit)).all()
    conn.commit()
    return list(rows)


def outbox_size(conn: Connection, partition: int) -> int:
    size = conn.execute(select(func.count()).select_from(push_outbox)
                        .where(push_outbox.c.partition == partition)).scalar_one()
    conn.commit()
    return int(size)


def sent(conn: Connection, keys: list[str]) -> None:
    if keys:
        conn.execute(push_outbox.delete().where(push_outbox.c.key.in_(keys)))
    conn.commit()


def retry_later(conn: Connection, key: str, attempts: int, next_at: datetime) -> None:
    conn.execute(push_outbox.update().where(push_outbox.c.key == key)
                 .values(attempts=attempts, next_at=next_at.replace(tzinfo=None)))
    conn.commit()


def forget_pushkeys(conn: Connection, rejected: list[tuple[str, str]]) -> int:
    """Removes the registrations whose (user, pushkey) the gateway rejected."""
    if not rejected:
        return 0
    removed = conn.execute(devices.delete().where(tuple_(devices.c.user, devices.c.pushkey).in_(rejected))).rowcount
    conn.commit()
    return int(removed)
