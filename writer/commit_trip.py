"""A batch's writes and its COMMIT, sent to MySQL as one round trip.

A batch wrote its rows, then the echoes its copies settle (writer/copies.py),
sometimes asked whether another process is queued for the lock, then
committed: up to four round trips while the partition's lock is held, each
one that the batch's senders and every other host's writer of the partition
waited for. A copy between partitions waits for two such commits.

mysqlclient sends several statements as one query (``CLIENT_MULTI_STATEMENTS``,
its default), and the server runs them in order and stops at the first that
fails: "If one of the statements fails, the remaining statements are not
executed" (MySQL's C API, multiple statement execution). So the COMMIT that
ends a ``Trip`` runs only if every statement before it did, and each
statement's answer comes back in order behind it.

What a failure means, by where it happened:
- a statement before the COMMIT failed on the server: nothing is committed;
  the transaction is rolled back here (a lock wait time-out rolls back only
  its statement, and the rows before it must not ride on the next commit),
  and the error is raised as SQLAlchemy's, as a statement's would be
  (``IntegrityError`` for a retry's unique key, a deadlock's ``OperationalError``);
- the link failed (a client error, 2000-2999) on a trip that commits, or the
  COMMIT itself failed: the server may have committed it all, so the outcome
  is unknown (``CommitUnknown``), and the caller asks MySQL on a fresh
  connection, as it did when a lone COMMIT failed. A link that was already
  gone before the send reads the same (its rows are then not found);
- a rollback that fails, or a link that is gone, invalidates the connection:
  MySQL ends its session and rolls back whatever it held.

The statements use mysqlclient's own escaping (``%s``, one value each), as
SQLAlchemy's executions on this driver do. A batch whose values would not fit
one query (``TRIP_VALUES_MAX_BYTES``) sends its first rows ahead, in the same
transaction, and its last trip commits them all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import MySQLdb
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

# A client error (CR_*): the answer did not come back, whatever the server did.
_CLIENT_ERRORS = range(2000, 3000)


class CommitUnknown(Exception):
    """A trip that commits was sent, and its answer lost or its COMMIT refused: it may have taken."""


@dataclass
class Trip:
    """Statements to send as one, in order; ``commit()`` ends them with COMMIT."""

    statements: list[str] = field(default_factory=list)
    params: list[object] = field(default_factory=list)
    asked_at: int | None = None  # the statement whose one value is ``TripAnswer.asked``
    commits: bool = False

    def add(self, sql: str, params: Sequence[object] = ()) -> None:
        assert not self.commits, "nothing goes after the COMMIT"
        self.statements.append(sql)
        self.params.extend(params)

    def ask(self, sql: str, params: Sequence[object] = ()) -> None:
        """A statement answering one value, read back as ``TripAnswer.asked``."""
        self.asked_at = len(self.statements)
        self.add(sql, params)

    def commit(self) -> None:
        self.add("COMMIT")
        self.commits = True

    @property
    def sql(self) -> str:
        return ";\n".join(self.statements)


@dataclass(frozen=True, slots=True)
class TripAnswer:
    asked: object  # the value the ``ask`` statement answered (None if there was none)


def insert_rows(table: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> tuple[str, list[object]]:
    """One multi-row INSERT of ``rows`` (each in ``columns``' order) and its values."""
    values: list[object] = []
    count = 0
    for row in rows:
        values.extend(row)
        count += 1
    one = "(" + ", ".join(["%s"] * len(columns)) + ")"
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES " + ", ".join([one] * count), values


# What one query carries in values at most, counting four bytes a character (UTF-8's most):
# half of MariaDB's default max_allowed_packet (16 MiB), so that what the driver escapes (a
# quote or a backslash doubled) still fits. A batch of 500 bodies of 4,000 characters
# (CHAT_BATCH_MAX, CHAT_BODY_MAX_CHARS) is 8 MB by that count; a turn's first batch may
# carry as many drained copies again.
TRIP_VALUES_MAX_BYTES = 8 * 1024 * 1024


def in_runs(rows: Iterable[Sequence[object]], budget: int = TRIP_VALUES_MAX_BYTES) -> list[list[Sequence[object]]]:
    """``rows`` cut, in order, into runs whose values come to ``budget`` bytes at most by
    the count above (a row larger than that on its own is a run of its own)."""
    runs: list[list[Sequence[object]]] = []
    run: list[Sequence[object]] = []
    size = 0
    for row in rows:
        weight = sum(4 * len(v) if isinstance(v, str) else 8 for v in row)
        if run and size + weight > budget:
            runs.append(run)
            run, size = [], 0
        run.append(row)
        size += weight
    if run:
        runs.append(run)
    return runs


def send(conn: Connection, trip: Trip) -> TripAnswer:
    """Sends ``trip`` on ``conn``'s session, in one round trip, and reads every answer.
    Raises a statement's error (nothing committed, rolled back) or ``CommitUnknown``."""
    raw = conn.connection.dbapi_connection
    assert raw is not None
    cursor = raw.cursor()
    reading, asked = 0, None  # the statement whose answer is being read
    try:
        cursor.execute(trip.sql, trip.params)
        while True:
            if reading == trip.asked_at:
                row = cursor.fetchone()
                asked = row[0] if row else None
            reading += 1
            if reading == len(trip.statements):
                break
            if not cursor.nextset():
                raise CommitUnknown(f"{len(trip.statements)} statements sent, {reading} answered")
    except MySQLdb.Error as exc:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        if conn.dialect.is_disconnect(exc, raw, cursor):  # type: ignore[arg-type]  # the driver's Error
            conn.invalidate()  # the session, its transaction and the writer lock with it, are gone
        else:
            roll_back(conn)
        if trip.commits and (code in _CLIENT_ERRORS or reading == len(trip.statements) - 1):
            # sent or not, its answer is lost: it may all have run (an error before the send
            # reads the same, and is then looked for, and not found, like one that did not take)
            raise CommitUnknown(f"statement {reading + 1} of {len(trip.statements)}: {exc}") from exc
        raise DBAPIError.instance(trip.statements[reading] if reading < len(trip.statements) else trip.sql,
                                  None, exc, MySQLdb.Error) from None
    except BaseException:
        # not the server's refusal (a cancel, a bug): whatever ran must not ride on a later commit
        roll_back(conn)
        raise
    finally:
        with contextlib.suppress(MySQLdb.Error):
            cursor.close()
    return TripAnswer(asked)


def roll_back(conn: Connection) -> None:
    """Rolls back the session's transaction, which SQLAlchemy may not know it has (a
    trip's statements bypass it). If the rollback fails, the connection is invalidated:
    its session ends, and MySQL rolls the transaction back with it."""
    if conn.invalidated:
        return  # its session is gone, and its transaction with it
    raw = conn.connection.dbapi_connection
    if raw is None:
        return
    try:
        raw.rollback()
    except MySQLdb.Error:
        conn.invalidate()
