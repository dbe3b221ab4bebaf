"""What a client sends a daemon's WebSocket, read and judged as RFC 6455 asks,
with no I/O: bytes in, a list of events out.

Each frame is judged on its header, before its payload arrives: reserved
bits, reserved opcodes, an unmasked frame, a fragmented or over-125-byte
control frame, a continuation with no message to continue, or a new message
inside a fragmented one fail the connection with 1002; a frame (or, where
messages are kept, a message) over its limit with 1009. Text is checked as
UTF-8 while it arrives, across frames, and fails with 1007 at the first
byte that cannot be UTF-8, not at the end of the message. A close frame is
answered with its own code (RFC 6455 section 5.5.1), or 1002 for an
invalid code or a one-byte payload, 1007 for a reason that is not UTF-8.

A connection holds one of these only while something is unfinished (bytes
of a frame, or a fragmented message): clients of the push-only ``/v1/ws``
rarely send anything but pongs. Payloads are unmasked and checked chunk by
chunk as they come, and kept only where messages are wanted (the
conformance testee echoes them): the push-only daemon keeps at most the
three bytes of an unfinished UTF-8 character per message.
"""

from __future__ import annotations

import codecs
from typing import NamedTuple

from websockets.frames import EXTERNAL_CLOSE_CODES, apply_mask

from chat.errors import CloseCode
from daemon.wire import Opcode

CONTROL_MAX = 125  # RFC 6455 section 5.5
OPCODES = {op.value: op for op in Opcode}
DATA = (Opcode.TEXT, Opcode.BINARY)
_utf8 = codecs.utf_8_decode
_Utf8Decoder = codecs.getincrementaldecoder("utf-8")


class Ending(NamedTuple):
    """The close frame to answer with, after which the connection closes:
    the peer's own close echoed (``metric`` None), or a violation."""

    code: int
    reason: str
    metric: str | None


class DataMessage(NamedTuple):
    """A data message, reported when its last frame is in. ``data`` is the
    whole payload where messages are kept, else empty."""

    opcode: Opcode
    data: bytes


class Control(NamedTuple):
    opcode: Opcode  # PING or PONG
    data: bytes


FRAGMENT = DataMessage(Opcode.CONT, b"")  # a data frame that is not a message's last


def protocol_error(reason: str) -> Ending:
    return Ending(CloseCode.PROTOCOL_ERROR, reason, "protocol_error")


def close_answer(payload: bytes) -> Ending:
    """The answer to a peer's close frame (RFC 6455 sections 5.5.1, 7.4)."""
    if not payload:
        return Ending(CloseCode.NORMAL, "", None)
    if len(payload) == 1:
        return protocol_error("close frame with a one-byte payload")
    code = int.from_bytes(payload[:2], "big")
    if not (code in EXTERNAL_CLOSE_CODES or 3000 <= code < 5000):
        return protocol_error("invalid close code")
    try:
        _utf8(payload[2:], "strict", True)
    except UnicodeDecodeError:
        return Ending(CloseCode.INVALID_DATA, "close reason is not UTF-8", "invalid_utf8")
    return Ending(code, "", None)


class _InFlight:
    """A data message whose frames are still arriving."""

    __slots__ = ("opcode", "decoder", "parts", "size")

    def __init__(self, opcode: Opcode):
        self.opcode = opcode
        self.decoder = _Utf8Decoder() if opcode is Opcode.TEXT else None
        self.parts: list[bytes] = []
        self.size = 0


class Inbound:
    """Client frames, fed in as they arrive. ``feed`` returns, in order,
    ``Control`` (pings, pongs), ``DataMessage`` (a data frame: ``FRAGMENT`` unless
    it ends a message) and at most one ``Ending``, which is always last:
    nothing is read after it."""

    __slots__ = ("_buffer", "_opcode", "_fin", "_mask", "_left", "_seen", "_message", "_max_frame",
                 "_max_message", "_keep", "_ended")

    def __init__(self, max_frame: int, max_message: int | None = None, keep_messages: bool = False):
        """``max_frame``: largest frame payload (1009 past it). With
        ``keep_messages``, messages are reassembled and reported whole, up to
        ``max_message`` bytes (1009 past it)."""
        self._buffer = bytearray()
        self._opcode: Opcode | None = None  # the frame whose payload is being read
        self._fin = True
        self._mask = b""
        self._left = 0  # payload bytes of that frame still to come
        self._seen = 0  # payload bytes of it already read (the mask's phase)
        self._message: _InFlight | None = None
        self._max_frame = max_frame
        self._max_message = max_message
        self._keep = keep_messages
        self._ended = False

    @property
    def idle(self) -> bool:
        """Nothing unfinished: the connection can drop this reader."""
        return not self._buffer and self._opcode is None and self._message is None

    def feed(self, data: bytes) -> list[Control | DataMessage | Ending]:
        if self._ended:
            return []
        buffer = self._buffer
        buffer += data
        events: list[Control | DataMessage | Ending] = []
        at = 0
        while True:
            if self._opcode is None:
                used = self._header(buffer, at, events)
                if used == 0:
                    break
                at += used
                if self._ended:
                    break
            if self._opcode in DATA or self._opcode is Opcode.CONT:
                took = min(self._left, len(buffer) - at)
                if took or not self._left:
                    ending = self._payload(bytes(buffer[at:at + took]), events)
                    at += took
                    if ending is not None:
                        events.append(ending)
                        self._ended = True
                        break
                if self._left:
                    break
            else:  # a control frame: at most 125 bytes, read whole
                if len(buffer) - at < self._left:
                    break
                payload = bytes(buffer[at:at + self._left])
                at += self._left
                opcode, self._opcode = self._opcode, None
                assert opcode is not None  # a control frame's header set it
                if self._mask:
                    payload = apply_mask(payload, self._mask)
                if opcode is Opcode.CLOSE:
                    events.append(close_answer(payload))
                    self._ended = True
                    break
                events.append(Control(opcode, payload))
        del buffer[:at]
        if self._ended:
            self._buffer = bytearray()
            self._message = None
        return events

    def _header(self, buffer: bytearray, at: int, events: list) -> int:
        """Reads one frame header at ``at``; its length, or 0 if incomplete.
        A violation is appended to ``events`` (and ends the reader)."""
        have = len(buffer) - at
        if have < 2:
            return 0
        head1, head2 = buffer[at], buffer[at + 1]
        length = head2 & 0x7F
        size = 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if head2 & 0x80 else 0)
        if have < size:
            return 0
        ending = self._judge(head1, head2, length, buffer, at)
        if ending is not None:
            events.append(ending)
            self._ended = True
            return size
        if length == 126:
            length = int.from_bytes(buffer[at + 2:at + 4], "big")
        elif length == 127:
            length = int.from_bytes(buffer[at + 2:at + 10], "big")
        opcode = OPCODES[head1 & 0x0F]
        if opcode in DATA or opcode is Opcode.CONT:
            limit = self._max_frame
            if self._keep and self._max_message is not None:
                so_far = self._message.size if self._message is not None else 0
                limit = min(limit, self._max_message - so_far)
            if length > limit:
                events.append(Ending(CloseCode.TOO_BIG, "frame too big" if length > self._max_frame
                                     else "message too big", "frame_too_big"))
                self._ended = True
                return size
        self._opcode, self._fin, self._left, self._seen = opcode, bool(head1 & 0x80), length, 0
        self._mask = bytes(buffer[at + size - 4:at + size])
        return size

    def _judge(self, head1: int, head2: int, length: int, buffer: bytearray, at: int) -> Ending | None:
        """The header's violations, in the order RFC 6455 section 5 lists them."""
        if head1 & 0x70:
            return protocol_error("reserved bits set")
        opcode = OPCODES.get(head1 & 0x0F)
        if opcode is None:
            return protocol_error("reserved opcode")
        if not head2 & 0x80:
            return protocol_error("unmasked client frame")
        if opcode in DATA:
            if self._message is not None:
                return protocol_error("new message inside a fragmented message")
        elif opcode is Opcode.CONT:
            if self._message is None:
                return protocol_error("continuation frame with no message to continue")
        elif not head1 & 0x80:
            return protocol_error("fragmented control frame")
        elif length > CONTROL_MAX:
            return protocol_error("control frame over 125 bytes")
        if length == 127 and buffer[at + 2] & 0x80:
            return protocol_error("frame length with its most significant bit set")
        return None

    def _payload(self, chunk: bytes, events: list) -> Ending | None:
        """A chunk of a data frame's payload: unmasked, checked, kept."""
        if self._mask:
            phase = self._seen & 3
            chunk = apply_mask(chunk, self._mask[phase:] + self._mask[:phase] if phase else self._mask)
        self._seen += len(chunk)
        self._left -= len(chunk)
        done = not self._left
        message = self._message
        if message is None:
            opcode = self._opcode
            assert opcode is not None  # a data frame's header set it
            if done and self._fin:  # a whole message in one frame, all here: the common case
                self._opcode = None
                if opcode is Opcode.TEXT:
                    try:
                        _utf8(chunk, "strict", True)
                    except UnicodeDecodeError:
                        return Ending(CloseCode.INVALID_DATA, "text is not UTF-8", "invalid_utf8")
                events.append(DataMessage(opcode, chunk if self._keep else b""))
                return None
            message = self._message = _InFlight(opcode)
        if message.decoder is not None:
            try:
                message.decoder.decode(chunk, done and self._fin)
            except UnicodeDecodeError:
                return Ending(CloseCode.INVALID_DATA, "text is not UTF-8", "invalid_utf8")
        message.size += len(chunk)
        if self._keep and chunk:
            message.parts.append(chunk)
        if not done:
            return None
        self._opcode = None
        if not self._fin:
            events.append(FRAGMENT)
            return None
        self._message = None
        events.append(DataMessage(message.opcode, b"".join(message.parts)))
        return None
