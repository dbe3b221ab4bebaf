"""Presence in MySQL (docs/presence.md): each user's last seen and whether
they hide their presence. Blocking calls on a connection the caller holds
(in a transaction, for the writes), run in the callers' own threads."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.engine import Connection

from chat.messages import rfc3339
from db.sql import presence


def ms_to_datetime(ms: int) -> datetime:
    """Milliseconds since the epoch as the naive UTC ``DATETIME(3)`` MySQL stores."""
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)


def datetime_to_ms(value: datetime) -> int:
    return round(value.replace(tzinfo=UTC).timestamp() * 1000)


def store_last_seen(conn: Connection, seen: dict[str, int]) -> None:
    """Each user's last seen (ms), in one statement; a later one never goes back (a
    sweep of a dead daemon may come after the user was seen elsewhere)."""
    if not seen:
        return
    statement = insert(presence).values([{"user": u, "last_seen": ms_to_datetime(ms)} for u, ms in seen.items()])
    later = func.greatest(func.coalesce(presence.c.last_seen, statement.inserted.last_seen),
                          statement.inserted.last_seen)
    conn.execute(statement.on_duplicate_key_update(last_seen=later))


def set_hidden(conn: Connection, user: str, hidden: bool) -> int | None:
    """Stores the user's choice; returns their last seen (ms), which showing again reveals."""
    statement = insert(presence).values(user=user, hidden=hidden)
    conn.execute(statement.on_duplicate_key_update(hidden=statement.inserted.hidden))
    last = conn.execute(select(presence.c.last_seen).where(presence.c.user == user)).scalar()
    return None if last is None else datetime_to_ms(last)


def is_hidden(conn: Connection, user: str) -> bool:
    return bool(conn.execute(select(presence.c.hidden).where(presence.c.user == user)).scalar())


def hidden_users(conn: Connection) -> list[str]:
    return list(conn.execute(select(presence.c.user).where(presence.c.hidden.is_(True))).scalars())


def rows_of(conn: Connection, users: list[str]) -> dict[str, tuple[datetime | None, bool]]:
    """(last seen, hidden) of those of ``users`` that have a row."""
    if not users:
        return {}
    rows = conn.execute(select(presence.c.user, presence.c.last_seen, presence.c.hidden)
                        .where(presence.c.user.in_(users))).all()
    return {r.user: (r.last_seen, bool(r.hidden)) for r in rows}


def view(users: list[str], online: list[bool], rows: dict[str, tuple[datetime | None, bool]]) -> list[dict]:
    """What a client is told of each user: online, or offline and last seen; a hidden one reads
    as offline and never seen. Pure."""
    out = []
    for user, on in zip(users, online, strict=True):
        last_seen, hidden = rows.get(user, (None, False))
        if hidden:
            on, last_seen = False, None
        out.append({"user": user, "online": on,
                    "last_seen": None if on or last_seen is None else rfc3339(last_seen.replace(tzinfo=UTC))})
    return out
