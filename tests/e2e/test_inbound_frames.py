"""What a live /v1/ws answers to each kind of client frame, read as raw
frames off the socket: close codes echoed, UTF-8 checked as text arrives,
fragmentation rules, and pings answered in order."""

import asyncio
import base64
import os

import pytest

from daemon.wire import FrameReader, Opcode
from tests.core.test_inbound import BINARY, CLOSE, CONT, PING, TEXT, close, frame
from harness.system import running_system
from tests.timing import PATIENCE


@pytest.fixture(scope="module")
def live(dbs):
    with running_system(dbs, daemons=1, apis=0) as s:
        yield s


class RawClient:
    """A WebSocket client that writes whatever bytes it is given and reads
    the server's frames as they come, after the hello."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer, self.frames = reader, writer, FrameReader(None, mask=False)
        self.pending: list = []

    @classmethod
    async def open(cls, system, user: str) -> "RawClient":
        reader, writer = await asyncio.open_connection("127.0.0.1", system.daemon_port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(f"GET /v1/ws?token={system.token(user)} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                     f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                     .encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PATIENCE)
        assert head.startswith(b"HTTP/1.1 101"), head
        client = cls(reader, writer)
        hello = await client.next()
        assert hello.opcode is Opcode.TEXT and b'"hello"' in hello.data
        return client

    async def next(self, timeout: float = PATIENCE):
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            assert data, "the server closed the socket without a close frame"
            self.pending += self.frames.feed(data)
        return self.pending.pop(0)

    async def close_code(self) -> int:
        """The code of the server's close frame (skipping pings it sends)."""
        while (got := await self.next()).opcode is not Opcode.CLOSE:
            assert got.opcode is Opcode.PING, got
        return int.from_bytes(got.data[:2], "big")


async def test_text_that_is_not_utf8_closes_with_1007(live, users):
    client = await RawClient.open(live, users("u"))
    client.writer.write(frame(TEXT, b"caf\xe9"))  # Latin-1, not UTF-8
    assert await client.close_code() == 1007


async def test_invalid_utf8_closes_with_1007_before_the_fragmented_message_ends(live, users):
    client = await RawClient.open(live, users("u"))
    client.writer.write(frame(TEXT, "κόσμε".encode(), fin=False) + frame(CONT, b"\xf4\x90\x80\x80", fin=False))
    assert await client.close_code() == 1007  # no last fragment was sent


@pytest.mark.parametrize("frames", [
    frame(CONT, b"orphan"),  # a continuation with nothing to continue
    frame(TEXT, b"a", fin=False) + frame(BINARY, b"b"),  # a new message inside a fragmented one
    close(1005),  # a close code no endpoint may send
    frame(CLOSE, b"\x03"),  # a one-byte close payload
], ids=["orphan continuation", "message inside a message", "close code 1005", "one-byte close"])
async def test_fragmentation_and_close_violations_close_with_1002(live, users, frames):
    client = await RawClient.open(live, users("u"))
    client.writer.write(frames)
    assert await client.close_code() == 1002


async def test_a_ping_before_a_violation_in_the_same_write_is_answered_first(live, users):
    client = await RawClient.open(live, users("u"))
    client.writer.write(frame(PING, b"first") + frame(0x3, b"reserved opcode"))
    pong = await client.next()
    assert (pong.opcode, pong.data) == (Opcode.PONG, b"first")
    assert await client.close_code() == 1002


@pytest.mark.parametrize("code", [1000, 1001, 3000, 4999])
async def test_a_close_in_the_middle_of_a_fragmented_message_with_a_ping_is_echoed(live, users, code):
    client = await RawClient.open(live, users("u"))
    client.writer.write(frame(TEXT, b"fragm", fin=False) + frame(PING, b"mid"))
    pong = await client.next()
    assert (pong.opcode, pong.data) == (Opcode.PONG, b"mid")
    client.writer.write(frame(CONT, b"ent", fin=False) + close(code, b"bye"))
    assert await client.close_code() == code
