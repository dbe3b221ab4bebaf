"""The message as it travels: MySQL row -> Mongo document -> oplog entry -> JSON frame.

Pure functions only, so the shapes are tested with plain dicts. A message is
encoded to bytes once and the same bytes go to every socket.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson


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
        return doc

    def to_public(self) -> dict:
        return public(self.id, self.sender, self.recipient, self.body, self.created_at, self.client_msg_id)


def public(msg_id: int, sender: str, recipient: str, body: str, created_at: datetime,
           client_msg_id: str | None) -> dict:
    """The public JSON shape (README, 'public contract'): the API's answers and
    the daemons' frames are built here, so they cannot drift apart."""
    return {"type": "message", "id": str(msg_id), "from": sender, "to": recipient, "body": body,
            "created_at": rfc3339(created_at), "client_msg_id": client_msg_id}


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
    Straight from the document: building a Message first cost 0.6 us of a
    message's ~4 us of Python in the daemon (loadtest/hotpath.py)."""
    created = doc["created_at"]
    if created.tzinfo is None:  # pymongo's default: naive datetimes, in UTC
        created = created.replace(tzinfo=UTC)
    msg_id, sender, recipient = int(doc["_id"]), doc["from"], doc["to"]
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
                and (doc.get("client_msg_id") is None or type(doc["client_msg_id"]) is str))
    except (KeyError, TypeError):
        return False


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def shown_digest(doc: dict) -> int:
    """64 bits of SHA-256 over what a device shows of a message (id, sender,
    recipient, created_at to the millisecond, client_msg_id, body): two documents
    with the same digest show the same. MySQL computes the same over its rows
    (``db.stream_ranges.StreamRanges.confirm``, where the text is built
    alike); a daemon compares the two to trust the oplog's documents without
    reading every row. The lengths keep fields apart whatever they contain."""
    created = doc["created_at"]
    if created.tzinfo is None:  # pymongo's default: naive datetimes, in UTC
        created = created.replace(tzinfo=UTC)
    sender, recipient = doc["from"], doc["to"]
    text = (f"{int(doc['_id'])}\x1f{(created - _EPOCH) // _MS}\x1f{doc.get('client_msg_id') or ''}\x1f"
            f"{len(sender)}\x1f{sender}\x1f{len(recipient)}\x1f{recipient}\x1f{doc['body']}")
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
