"""What a client sends on ``/v1/ws`` after its hello: delivery acks and read
markers (docs/receipts.md, "What a client sends"), on their way to the host's
writer, which judges and stores them as it does the API's.

A flood never becomes a queue: a connection keeps at most one ack (the highest)
and one marker per peer waiting, and sends one request at a time; a newer
frame replaces a waiting one (an ack or a marker "up to" says all an older
one did). A refusal is an ``error`` frame, and the socket stays open; a frame
that is not one of these is a protocol error of the client's (close 1007).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import orjson

from chat.auth import is_user_id
from chat.drafts import Draft
from chat.errors import ChatError
from chat.messages import Kind, Message
from chat.parsing import is_decimal, is_device_id
from chat.write_errors import WRITE_FAILURES, answer_for

log = logging.getLogger("chat.daemon")

ID_MAX = 2**63 - 1
DEFAULT_DEVICE = "default"  # the device a socket's acks count for when its handshake names none
# Peers whose read markers may wait at once on one connection: a client that
# reads more conversations than this between two answers of the writer gets
# its oldest waiting marker replaced by the newest (it is resent by the client
# as it reads on; the reader's unread count stays exact in MySQL either way).
READS_WAITING_MAX = 64

Submit = Callable[[Draft], Awaitable[tuple[Message, bool]]]


class BadClientFrame(ChatError):
    """Not an ``ack`` or ``read`` frame of the contract: the reason is the close frame's."""


def parse(data: bytes) -> tuple[str, str | None, int] | None:
    """("ack", None, upto) or ("read", peer, upto); None for data that is not
    a JSON object of either type (dropped, as all data was before clients
    could send any: a WebSocket library's own test messages, a newer client's
    frames); ``BadClientFrame`` for an ack or read frame of the wrong shape."""
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(frame, dict):
        return None
    kind = frame.get("type")
    if kind == "ack":
        fields: tuple[str, ...] = ("type", "upto")
    elif kind == "read":
        fields = ("type", "peer", "upto")
    else:
        return None
    if set(frame) != set(fields):
        raise BadClientFrame(f"{kind} frame fields are {', '.join(fields)}")
    upto = frame["upto"]
    if not (isinstance(upto, str) and is_decimal(upto, 19) and 1 <= int(upto) <= ID_MAX):
        raise BadClientFrame("upto must be a message id (a decimal string)")
    peer = frame.get("peer")
    if kind == "read" and not is_user_id(peer):
        raise BadClientFrame("peer must be a user id")
    return kind, peer, int(upto)


def device_of(raw: str | None) -> str | None:
    """The handshake's ``device`` parameter, checked (a user id's alphabet and length); None if bad."""
    if raw is None:
        return DEFAULT_DEVICE
    return raw if is_device_id(raw) else None


class ClientFrames:
    """One WebSocket's acks and read markers, waiting for the writer, one request at a time."""

    __slots__ = ("_ack", "_device", "_reads", "_send_text", "_sending", "_submit", "_user")

    def __init__(self, user: str, device: str, submit: Submit | None, send_text: Callable[[bytes], None]):
        self._user, self._device = user, device
        self._submit = submit  # None: no writer on this host (development without one)
        self._send_text = send_text
        self._ack = 0
        self._reads: dict[str, int] = {}
        self._sending: asyncio.Task | None = None

    def take(self, data: bytes) -> None:
        """One client frame; raises ``BadClientFrame``."""
        parsed = parse(data)
        if parsed is None:
            return
        kind, peer, upto = parsed
        if kind == "ack":
            self._ack = max(self._ack, upto)
        else:
            assert peer is not None
            reads = self._reads
            if peer not in reads and len(reads) >= READS_WAITING_MAX:
                del reads[next(iter(reads))]
            reads[peer] = max(reads.get(peer, 0), upto)
        if self._sending is None or self._sending.done():
            self._sending = asyncio.get_running_loop().create_task(self._send_waiting())

    def close(self) -> None:
        """The socket is gone: what waits is dropped (the client sends it again on its next connection)."""
        if self._sending is not None:
            self._sending.cancel()

    async def _send_waiting(self) -> None:
        while self._ack or self._reads:
            if self._ack:
                draft = Draft(self._user, self._device, "", None, Kind.ACK, self._ack)
                self._ack = 0
            else:
                peer = next(iter(self._reads))
                draft = Draft(self._user, peer, "", None, Kind.READ, self._reads.pop(peer))
            await self._one(draft)

    async def _one(self, draft: Draft) -> None:
        frame = "ack" if draft.kind == Kind.ACK else "read"
        if self._submit is None:
            self._error(frame, "writer_unavailable", "this host has no writer (CHAT_WRITER_SOCKET)")
            return
        try:
            await self._submit(draft)
        except WRITE_FAILURES as exc:
            answer = answer_for(exc)
            if answer.status == 503:  # docs/receipts.md, "Errors": any way the write path is away is one code
                self._error(frame, "writer_unavailable", "the writer did not take it; send it again")
            else:
                self._error(frame, answer.code, answer.message)
        except Exception:
            log.exception("event=client_frame_failed frame=%s", frame)
            self._error(frame, "server_error", "internal error; send it again")

    def _error(self, frame: str, code: str, message: str) -> None:
        self._send_text(orjson.dumps({"type": "error", "code": code, "message": message, "frame": frame}))
