"""The few bytes of RFC 6455 that every load client here speaks: the upgrade
request, the status of the server's answer (``Handshake`` reads it for the
clients that keep an object a connection), and the server's frames.

Standard library only: the million client's 60-odd processes import it, and
each megabyte of imports is paid in every one of them. Far cheaper than a
general parser: the clients' cost per frame is paid on the same cores as the
server's.
"""

from __future__ import annotations

import base64
import os

KEY = base64.b64encode(os.urandom(16)).decode()  # any 16 bytes: a server only echoes its hash

# A server's open data message: its opcode and its payloads so far (Centrifugo may
# split a long message into continuation frames; the daemon never does).
Fragments = tuple[int, list[bytes]]


def upgrade_request(host: str, port: int, path: str, headers: str = "") -> bytes:
    """The GET that opens a WebSocket on ``path``; ``headers``: more lines, each ending in CRLF."""
    return (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"{headers}Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


def head_status(buf: bytes) -> tuple[int | None, bytes]:
    """The HTTP status of a complete response head and the bytes after it;
    (None, buf) while the head is incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None, buf
    return int(buf[9:12]), buf[end + 4:]


class Handshake:
    """The server's answer to the upgrade request, read as its bytes come in:
    ``status`` is 0 until the head is whole, then its HTTP status (101: open)."""

    __slots__ = ("status", "_head")

    def __init__(self) -> None:
        self.status = 0
        self._head = b""  # the head so far

    @property
    def refused(self) -> bool:
        return self.status not in (0, 101)

    def read(self, data: bytes) -> bytes:
        """The bytes after the head (the server's first frames) once it is open; b"" while the head
        is incomplete or once the server refused."""
        status, rest = head_status(self._head + data)
        if status is None:
            self._head = rest
            return b""
        self.status, self._head = status, b""
        return rest if status == 101 else b""


def split_messages(buf: bytes, partial: Fragments | None) -> tuple[list[tuple[int, bytes]], bytes, Fragments | None]:
    """Whole server messages (opcode, payload) at the front of ``buf``, the unfinished rest, and
    the fragments of a message still open. A server sends its frames unmasked."""
    out: list[tuple[int, bytes]] = []
    pos, n = 0, len(buf)
    while n - pos >= 2:
        first, length, head = buf[pos], buf[pos + 1] & 0x7F, 2
        if length == 126:
            if n - pos < 4:
                break
            length, head = int.from_bytes(buf[pos + 2:pos + 4], "big"), 4
        elif length == 127:
            if n - pos < 10:
                break
            length, head = int.from_bytes(buf[pos + 2:pos + 10], "big"), 10
        if n - pos < head + length:
            break
        opcode, fin, payload = first & 0x0F, first & 0x80, buf[pos + head:pos + head + length]
        pos += head + length
        if opcode >= 0x8:  # control frames come whole, also between the fragments of a message
            out.append((opcode, payload))
        elif opcode:  # a new data message
            if fin:
                out.append((opcode, payload))
            else:
                partial = (opcode, [payload])
        elif partial is not None:  # a continuation
            partial[1].append(payload)
            if fin:
                out.append((partial[0], b"".join(partial[1])))
                partial = None
    return out, buf[pos:], partial


def masked(opcode: int, payload: bytes) -> bytes:
    """A client frame with a zero mask key (valid, RFC 6455 section 5.3), payload < 126 bytes."""
    return bytes((0x80 | opcode, 0x80 | len(payload))) + b"\x00\x00\x00\x00" + payload
