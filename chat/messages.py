"""The message as it travels: MySQL row -> Mongo document -> oplog entry -> JSON frame.

Pure functions only, so the shapes are tested with plain dicts. A message is
encoded to bytes once and the same bytes go to every socket. ``Message`` is the
one type of a row of the stream: ``from_row`` (a MySQL row), ``to_doc`` and
``from_doc`` (a Mongo document, or an oplog entry's ``o``), ``to_public``.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from sqlalchemy.engine import Row


class Kind(IntEnum):
    """What a row of a partition's stream is (docs/receipts.md). A message is 0,
    and its documents carry no ``kind`` at all: they are what they were before
    events existed. ``ACK`` is a request only: it is never a row."""

    MESSAGE = 0
    EDIT = 1  # the sender replaced the body of their message ``ref``
    DELETE = 2  # the sender deleted their message ``ref``
    READ = 3  # ``from`` has read ``to``'s messages up to ``ref``
    DELIVERED = 4  # a device of ``from`` received ``to``'s messages up to ``ref``
    ACK = 5  # a device's "received up to": updates device_acks, may write DELIVERED rows


ROW_KINDS = frozenset((Kind.MESSAGE, Kind.EDIT, Kind.DELETE, Kind.READ, Kind.DELIVERED))
REVISIONS = frozenset((Kind.EDIT, Kind.DELETE))  # events that change the message they name
MARKERS = frozenset((Kind.READ, Kind.DELIVERED))  # "up to" events: their ref is a message of the peer's
_TYPE = {Kind.MESSAGE: "message", Kind.EDIT: "edit", Kind.DELETE: "delete", Kind.READ: "read",
         Kind.DELIVERED: "delivered"}


# Not frozen: a frozen dataclass sets each field through object.__setattr__,
# which tripled the cost of building one (1.7 us against 0.6), and a daemon
# builds one per oplog entry. Nothing mutates a Message.
@dataclass(slots=True)
class Message:
    id: int  # gap-free in its partition, assigned in commit order (see writer/message_writer.py)
    sender: str
    recipient: str
    body: str
    created_at: datetime  # UTC, millisecond precision (what BSON keeps)
    client_msg_id: str | None = None
    # A copy in the recipient's partition names its original (chat.partitions); None on originals.
    origin_part: int | None = None
    origin_id: int | None = None
    kind: int = Kind.MESSAGE
    ref_id: int | None = None  # an event's message (or "up to"), an id of this row's partition
    edited_at: datetime | None = None  # a message's last edit
    deleted: bool = False  # a message deleted by its sender: a tombstone, its body ""

    @classmethod
    def from_row(cls, row: Row) -> Message:
        """A row of a partition's `messages` table (created_at is kept in UTC,
        without a zone). Columns a query leaves out take their defaults: the
        pusher reads only what it decides on (``pusher.store.rows_after``)."""
        edited = getattr(row, "edited_at", None)
        return cls(row.id, row.sender, row.recipient, row.body, row.created_at.replace(tzinfo=UTC),
                   getattr(row, "client_msg_id", None), getattr(row, "origin_part", None),
                   getattr(row, "origin_id", None), getattr(row, "kind", 0) or 0, getattr(row, "ref_id", None),
                   None if edited is None else edited.replace(tzinfo=UTC), bool(getattr(row, "deleted", False)))

    @classmethod
    def from_doc(cls, doc: dict) -> Message:
        """A document of `messages` (``to_doc``'s shape, ``is_message_doc`` holds),
        as a driver hands it back: datetimes naive (pymongo's default, in UTC) or
        aware, ids as int or bson.Int64."""
        created, edited = doc["created_at"], doc.get("edited_at")
        if created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        if edited is not None and edited.tzinfo is None:
            edited = edited.replace(tzinfo=UTC)
        origin_part, origin_id, ref = doc.get("origin_part"), doc.get("origin_id"), doc.get("ref")
        return cls(int(doc["_id"]), doc["from"], doc["to"], doc["body"], created, doc.get("client_msg_id"),
                   None if origin_part is None else int(origin_part), None if origin_id is None else int(origin_id),
                   int(doc.get("kind", 0)), None if ref is None else int(ref), edited, bool(doc.get("deleted")))

    def to_doc(self) -> dict:
        doc = {
            "_id": self.id,
            "from": self.sender,
            "to": self.recipient,
            "body": self.body,
            "created_at": self.created_at,
            "client_msg_id": self.client_msg_id,
        }
        if self.origin_part is not None:
            doc["origin_part"], doc["origin_id"] = self.origin_part, self.origin_id
        if self.kind:
            doc["kind"], doc["ref"] = int(self.kind), self.ref_id
        if self.edited_at is not None:
            doc["edited_at"] = self.edited_at
        if self.deleted:
            doc["deleted"] = True
        return doc

    def to_public(self) -> dict:
        if self.kind or self.edited_at is not None or self.deleted:
            return public_of(self.id, self.sender, self.recipient, self.body, self.created_at, self.client_msg_id,
                             self.kind, self.ref_id, self.edited_at, self.deleted)
        return public(self.id, self.sender, self.recipient, self.body, self.created_at, self.client_msg_id)


def public(msg_id: int, sender: str, recipient: str, body: str, created_at: datetime,
           client_msg_id: str | None) -> dict:
    """The public JSON shape (README, 'public contract'): the API's answers and
    the daemons' frames are built here, so they cannot drift apart."""
    return {"type": "message", "id": str(msg_id), "from": sender, "to": recipient, "body": body,
            "created_at": rfc3339(created_at), "client_msg_id": client_msg_id}


def public_of(msg_id: int, sender: str, recipient: str, body: str, created_at: datetime,
              client_msg_id: str | None, kind: int, ref: int | None, edited_at: datetime | None,
              deleted: bool) -> dict:
    """The public JSON shape of any row of the stream (docs/receipts.md, "Frames")."""
    if kind == Kind.MESSAGE:
        frame = public(msg_id, sender, recipient, "" if deleted else body, created_at, client_msg_id)
        if edited_at is not None:
            frame["edited_at"] = rfc3339(edited_at)
        if deleted:
            frame["deleted"] = True
        return frame
    frame = {"type": _TYPE[Kind(kind)], "id": str(msg_id), "from": sender, "to": recipient}
    if kind in MARKERS:
        frame["upto"] = str(ref)
    else:
        frame["ref"] = str(ref)
        if kind == Kind.EDIT:
            frame["body"] = body
    frame["created_at"] = rfc3339(created_at)
    if kind in REVISIONS:
        frame["client_msg_id"] = client_msg_id
    return frame


@functools.lru_cache(maxsize=256)  # a group commit stamps its whole batch with one time
def rfc3339(ts: datetime) -> str:
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_ms() -> datetime:
    """Now, truncated to what both MySQL DATETIME(3) and BSON dates keep."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


# (id, sender, recipient, created_at, JSON payload): what a daemon keeps of a message.
# A plain tuple, not a NamedTuple: the collector stops tracking exact tuples
# only (``daemon.recent_cache``), and a full recent cache of NamedTuples made a
# full collection 12 times longer (15 ms against 1.2, measured, 50,000 entries);
# building one also costs 0.46 us against 0.1.
Encoded = tuple[int, str, str, datetime, bytes]


def encode_doc(doc: dict) -> Encoded:
    """A Mongo document as the daemon keeps and sends it, its JSON encoded once.
    Straight from the document, not through ``Message.from_doc``: building a
    Message first cost 0.6 us of a message's ~4 us of Python in the daemon
    (loadtest/hotpath.py), and this runs once per oplog entry. It reads the
    fields ``from_doc`` reads, and tests/core/test_messages.py holds the two
    to the same frame."""
    created = doc["created_at"]
    if created.tzinfo is None:  # pymongo's default: naive datetimes, in UTC
        created = created.replace(tzinfo=UTC)
    msg_id, sender, recipient = int(doc["_id"]), doc["from"], doc["to"]
    if len(doc) > 6 and ("kind" in doc or "edited_at" in doc or "deleted" in doc):  # an event, or a revised message
        edited = doc.get("edited_at")
        if edited is not None and edited.tzinfo is None:
            edited = edited.replace(tzinfo=UTC)
        payload = orjson.dumps(public_of(msg_id, sender, recipient, doc["body"], created, doc.get("client_msg_id"),
                                         doc.get("kind", 0), doc.get("ref"), edited, bool(doc.get("deleted"))))
    else:
        payload = orjson.dumps(public(msg_id, sender, recipient, doc["body"], created, doc.get("client_msg_id")))
    # orjson's bytes keep the allocation they were built in: a 220-byte payload
    # held 4.3 KB of memory (measured, 50,000 of them), and a daemon's recent
    # cache holds 50,000. An exact copy holds 0.5 KB in all; join is the
    # cheapest way to make one (about 50 ns; bytes(memoryview()) took 270).
    return msg_id, sender, recipient, created, b"".join((payload, b""))


def is_message_doc(doc: dict) -> bool:
    """Whether a document of `messages` has the writer's shape: a positive
    integer _id, string from/to/body, a datetime created_at. The fast store is
    not trusted blindly (a script, a restore or another app may write there):
    a daemon releases only such documents, and only ids the truth has
    committed. About 0.2 us, against some 4 us of a message's Python."""
    try:
        msg_id = doc["_id"]
        # isinstance: BSON's int64 decodes to bson.Int64, a subclass of int (ids past 2**31)
        return (isinstance(msg_id, int) and msg_id is not True and msg_id > 0
                and type(doc["from"]) is str and type(doc["to"]) is str and type(doc["body"]) is str
                and isinstance(doc["created_at"], datetime)
                and (doc.get("client_msg_id") is None or type(doc["client_msg_id"]) is str)
                and (len(doc) <= 6 or _is_event_shape(doc)))
    except (KeyError, TypeError):
        return False


def _is_event_shape(doc: dict) -> bool:
    """The fields an event or a revised message adds, when present, have the writer's types."""
    kind = doc.get("kind", 0)
    if type(kind) is not int or kind not in ROW_KINDS:
        return False
    ref = doc.get("ref")
    if kind and not (isinstance(ref, int) and ref is not True and ref > 0):
        return False
    edited = doc.get("edited_at")
    return (edited is None or isinstance(edited, datetime)) and type(doc.get("deleted", False)) is bool


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)  # pymongo's default datetimes are naive, in UTC
_MS = timedelta(milliseconds=1)


def shown_digest(doc: dict) -> int:
    """64 bits of SHA-256 over what a device shows of a message (id, sender,
    recipient, created_at to the millisecond, client_msg_id, body): two documents
    with the same digest show the same. MySQL computes the same over its rows
    (``db.stream_ranges.StreamRanges.confirm``, where the text is built
    alike); a daemon compares the two to trust the oplog's documents without
    reading every row. The lengths keep fields apart whatever they contain."""
    created = doc["created_at"]
    # A naive one less the naive epoch: making it aware first (replace) would cost a third of
    # the digest's time (0.9 us), and the relay makes a digest for every message.
    millis = (created - (_EPOCH_NAIVE if created.tzinfo is None else _EPOCH)) // _MS
    sender, recipient = doc["from"], doc["to"]
    text = (f"{int(doc['_id'])}\x1f{millis}\x1f{doc.get('client_msg_id') or ''}\x1f"
            f"{len(sender)}\x1f{sender}\x1f{len(recipient)}\x1f{recipient}\x1f{doc['body']}")
    if kind := doc.get("kind"):  # an event: what it is and what it names are shown too
        text += f"\x1f{int(kind)}\x1f{doc['ref']}"
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "big")


def shown_digest_of(docs: list[dict]) -> int:
    """The digests of ``docs`` combined (XOR: order does not matter), as MySQL's BIT_XOR combines its rows'."""
    combined = 0
    for doc in docs:
        combined ^= shown_digest(doc)
    return combined


def inserted_docs(entry: dict, namespace: str) -> list[dict]:
    """Message documents inserted by one oplog entry, or [] for anything else.

    A plain insert is ``op: "i"``. On MongoDB, inserts made inside a transaction
    arrive as one ``op: "c"`` entry on ``admin.$cmd`` whose ``o.applyOps`` holds
    the inner entries. Updates, deletes (TTL or sweeper) and other namespaces
    give [] and are never pushed.
    """
    op = entry.get("op")
    if op == "i":
        return [entry["o"]] if entry.get("ns") == namespace else []
    if op == "c":
        inner = entry.get("o", {}).get("applyOps")
        if isinstance(inner, list):
            return [d for e in inner if isinstance(e, dict) for d in inserted_docs(e, namespace)]
    return []
