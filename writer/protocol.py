"""Frames between the API processes and the host's writer process (a Unix socket).

A frame is a 4-byte big-endian length, then that many bytes of JSON (an
array, positional: this is the hot path, and a key per field would double
what each message costs to encode). The socket is local and owner-only, but
the writer still treats what it reads as untrusted: a frame it cannot
decode into exactly these shapes ends that connection, and nothing of it is
stored (``BadFrame``).

request: ``[seq, sender, recipient, body, client_msg_id | null]`` for a message, and
         ``[seq, sender, recipient, body, client_msg_id | null, kind, ref_id]`` for an event
         (chat.messages.Kind, docs/receipts.md)
reply:   ``[seq, outcome, message | null]``, ``outcome`` an ``Outcome``'s wire string, ``message`` as
         ``[id, sender, recipient, body, created_at_ms, client_msg_id | null]`` for a message, and with
         ``kind, ref_id, edited_at_ms | null, deleted`` after them for anything else
goodbye: ``[0, "stopping", null]`` from a writer that is stopping. The API
         process sends nothing more on that connection and half-closes it;
         the writer answers every request it reads up to that end of stream.
         Bytes already on their way when the goodbye was sent are therefore
         answered too, not lost in a socket buffer at close (a restart
         refuses no POST).
"""

from __future__ import annotations

import asyncio
import struct
from datetime import UTC, datetime, timedelta

import orjson

from chat.drafts import Draft
from chat.frames import BadFrame, read_sized
from chat.messages import Kind, Message
from chat.write_errors import Outcome

HEADER = struct.Struct("!I")
# Replies come from our own writer, and may carry a message stored under a
# larger CHAT_BODY_MAX_CHARS than today's: the client's limit is generous.
REPLY_FRAME_MAX = 16 << 20
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MILLISECOND = timedelta(milliseconds=1)

# A reply's outcome is a ``chat.write_errors.Outcome``'s wire string; the goodbye's is this
# one, with seq 0, which no request uses (the API counts from 1).
STOPPING = "stopping"


def frame(payload: list) -> bytes:
    data = orjson.dumps(payload)
    return HEADER.pack(len(data)) + data


def request_frame_max(body_max_chars: int) -> int:
    """The largest request the API can send: orjson writes a character as at
    most 6 bytes (a control character as \\u00XX), and the other fields are
    short (user ids and client_msg_id are bounded by the API's validation)."""
    return 6 * body_max_chars + 4096


async def read_frame(reader: asyncio.StreamReader, limit: int) -> list | None:
    """The next frame's array, or None at a clean end of stream."""
    data = await read_sized(reader, HEADER, limit)
    if data is None:
        return None
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise BadFrame("not JSON") from None
    if not isinstance(payload, list):
        raise BadFrame("not an array")
    return payload


def _is_str(value: object) -> bool:
    return type(value) is str


def _is_seq(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**63


def request(seq: int, draft: Draft) -> bytes:
    if draft.kind:
        return frame([seq, draft.sender, draft.recipient, draft.body, draft.client_msg_id, int(draft.kind),
                      draft.ref_id])
    return frame([seq, draft.sender, draft.recipient, draft.body, draft.client_msg_id])


_REQUEST_KINDS = frozenset(int(k) for k in Kind if k != Kind.MESSAGE)


def parse_request(payload: list) -> tuple[int, Draft]:
    """A request's sequence number and draft. The API has validated the draft
    already; here only its shape is checked, so that no other local process
    can hand the writer something the database layer would choke on."""
    if len(payload) == 7:
        seq, sender, recipient, body, client_msg_id, kind, ref_id = payload
        if not (type(kind) is int and kind in _REQUEST_KINDS and _is_seq(ref_id) and ref_id > 0):
            raise BadFrame("request: wrong event kind or reference")
    elif len(payload) == 5:
        (seq, sender, recipient, body, client_msg_id), kind, ref_id = payload, Kind.MESSAGE, None
    else:
        raise BadFrame("request: 5 or 7 fields expected")
    if not (_is_seq(seq) and _is_str(sender) and _is_str(recipient) and _is_str(body)
            and (client_msg_id is None or _is_str(client_msg_id))):
        raise BadFrame("request: wrong field types")
    if not sender or (kind == Kind.MESSAGE and not (recipient and body)) or (kind == Kind.EDIT and not body):
        raise BadFrame("request: empty field")
    return seq, Draft(sender, recipient, body, client_msg_id, kind, ref_id)


def reply(seq: int, outcome: Outcome, msg: Message | None) -> bytes:
    fields = None
    if msg is not None:
        millis = (msg.created_at - EPOCH) // MILLISECOND  # exact: integer arithmetic
        fields = [msg.id, msg.sender, msg.recipient, msg.body, millis, msg.client_msg_id]
        if msg.kind or msg.edited_at is not None or msg.deleted:
            edited = None if msg.edited_at is None else (msg.edited_at - EPOCH) // MILLISECOND
            fields += [int(msg.kind), msg.ref_id, edited, msg.deleted]
    return frame([seq, outcome.wire, fields])


_GOODBYE = [0, STOPPING, None]
GOODBYE = frame(_GOODBYE)


def parse_reply(payload: list) -> tuple[int, Outcome | None, Message | None]:
    """A reply, or the goodbye as ``(0, None, None)``."""
    if payload == _GOODBYE:
        return 0, None, None
    if len(payload) != 3 or not _is_seq(payload[0]) or (outcome := Outcome.on_the_wire(payload[1])) is None:
        raise BadFrame("reply: bad shape")
    seq, _outcome, fields = payload
    if fields is None:
        return seq, outcome, None
    if len(fields) == 10:
        msg_id, sender, recipient, body, millis, client_msg_id, kind, ref_id, edited, deleted = fields
        edited_at = None if edited is None else EPOCH + edited * MILLISECOND
        return seq, outcome, Message(msg_id, sender, recipient, body, EPOCH + millis * MILLISECOND, client_msg_id,
                                     None, None, kind, ref_id, edited_at, deleted)
    msg_id, sender, recipient, body, millis, client_msg_id = fields
    created = EPOCH + millis * MILLISECOND
    return seq, outcome, Message(msg_id, sender, recipient, body, created, client_msg_id)
