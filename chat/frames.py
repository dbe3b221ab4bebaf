"""Length-prefixed frames on a local stream socket (the writer's and the relay's protocols)."""

from __future__ import annotations

import asyncio
import struct

from chat.errors import ChatError


class BadFrame(ChatError):
    """Not a frame of the protocol: the connection it came on is closed."""


async def read_sized(reader: asyncio.StreamReader, length: struct.Struct, limit: int, *,
                     length_included: bool = False) -> bytes | None:
    """The next frame's bytes, or None at a clean end of stream. ``length_included``:
    the length counts its own bytes and they are part of the frame (BSON)."""
    try:
        head = await reader.readexactly(length.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise BadFrame("truncated length") from None
        return None
    (size,) = length.unpack(head)
    rest = size - length.size if length_included else size
    if size > limit or rest < (1 if length_included else 0):
        raise BadFrame(f"frame of {size} bytes, limit {limit}")  # read no further
    try:
        body = await reader.readexactly(rest)
    except asyncio.IncompleteReadError:
        raise BadFrame("truncated frame") from None
    return head + body if length_included else body
