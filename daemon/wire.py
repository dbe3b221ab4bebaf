"""Bytes on the daemon's sockets, with no I/O: WebSocket frames out, and
plain HTTP/1.1 responses. What clients send is read by ``daemon.inbound``;
``FrameReader`` here reads a server's frames, for the load-test client.

Control frames are built by the websockets library's sans-I/O ``Frame``;
the one frame built per message,
a server's text frame, is a two-to-ten-byte header put on here (see
``text_frame``). This module keeps all of it out of the per-connection
state, which is what lets a daemon hold an idle connection in a few
kilobytes (docs/decisions/hand-written-wire.md).
"""

from __future__ import annotations

from collections.abc import Generator
from http import HTTPStatus

from websockets.exceptions import PayloadTooBig, ProtocolError
from websockets.frames import Close, Frame, Opcode
from websockets.streams import StreamReader

__all__ = ["FrameReader", "PayloadTooBig", "ProtocolError", "close_frame", "data_frame", "http_response",
           "pong_frame", "text_frame", "Opcode", "PING"]

PING = Frame(Opcode.PING, b"").serialize(mask=False)


def text_frame(payload: bytes) -> bytes:
    """One server-to-client text frame: FIN, opcode 1, no mask (servers never
    mask), RFC 6455 section 5.2. Built once per message, then written to every
    socket it goes to. By hand, not with ``Frame.serialize``: that checks and
    extends a generic frame and took 2.8 us of a message's ~35 us at full
    speed; this takes 0.5. A test compares the two byte for byte."""
    n = len(payload)
    if n < 126:
        return bytes((0x81, n)) + payload
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big") + payload
    return b"\x81\x7f" + n.to_bytes(8, "big") + payload


def data_frame(opcode: Opcode, payload: bytes) -> bytes:
    """One unfragmented server-to-client frame of any data opcode (the
    conformance testee's echo; the daemon's pushes use ``text_frame``)."""
    return Frame(opcode, payload).serialize(mask=False)


def close_frame(code: int, reason: str = "") -> bytes:
    return Frame(Opcode.CLOSE, Close(code, reason).serialize()).serialize(mask=False)


def pong_frame(data: bytes) -> bytes:
    return Frame(Opcode.PONG, data).serialize(mask=False)


class FrameReader:
    """Frames, fed in as they arrive. Raises ``PayloadTooBig`` as soon
    as a header announces more than ``max_size`` (the payload is never
    buffered) and ``ProtocolError`` on unmasked or malformed frames.

    What the load-test client and the tests read a daemon's frames with; a
    daemon reads its clients' frames with ``daemon.inbound.Inbound``.
    """

    __slots__ = ("_reader", "_parser", "_max_size", "_mask")

    def __init__(self, max_size: int | None, mask: bool = True):
        self._reader = StreamReader()
        self._max_size = max_size
        self._mask = mask  # client frames are masked; a client reading server frames passes False
        self._parser: Generator[None, None, Frame] | None = None

    def feed(self, data: bytes) -> list[Frame]:
        self._reader.feed_data(data)
        frames = []
        while True:
            if self._parser is None:
                self._parser = Frame.parse(self._reader.read_exact, mask=self._mask, max_size=self._max_size)
            try:
                next(self._parser)  # runs until it needs more bytes (yields) or has a frame
            except StopIteration as done:
                frames.append(done.value)
                self._parser = None
                if self._reader.buffer:
                    continue
            return frames

    @property
    def idle(self) -> bool:
        """No partial frame: the connection can drop this reader."""
        return self._parser is None and not self._reader.buffer


def http_response(status: int, body: bytes = b"", content_type: str = "application/json",
                  headers: dict[str, str] | None = None, keep_alive: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
             f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}",
             "Connection: keep-alive" if keep_alive else "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
