"""The write API's HTTP protocol (chat.serve.KeepAliveHttp10) on a real socket,
fed one read at a time: where the reads split a request is chosen here, which
a client on a TCP connection cannot choose. What is checked is what the
client reads back."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator

import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from chat.serve import HEAD_MAX_BYTES, KeepAliveHttp10
from tests.timing import PATIENCE, S

LIMIT = HEAD_MAX_BYTES


async def app(scope, receive, send):
    """Answers ``METHOD path body-length``, once the whole body is read."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = f"{scope['method']} {scope['path']} {size}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


class Client:
    def __init__(self, protocol: KeepAliveHttp10, reader: asyncio.StreamReader, state: ServerState):
        self.protocol, self.reader, self.state = protocol, reader, state
        self.calls = 0

    def reads(self, *reads: bytes) -> None:
        """Each of ``reads`` reaches the protocol as one read of the socket."""
        for data in reads:
            self.protocol.data_received(data)

    async def answers(self) -> list[tuple[int, bytes]]:
        """(status, body) of every answer, read until the server closes the connection."""
        data = await asyncio.wait_for(self.reader.read(), PATIENCE)
        return [(int(status), body) for status, body in
                re.findall(rb"HTTP/1\.1 (\d{3}) [^\r]*\r\n(?:[^\r]+\r\n)*\r\n([^H]*)", data)]


@contextlib.asynccontextmanager
async def connection(limit: int | None = None, idle: float = 60.0) -> AsyncIterator[Client]:
    loop = asyncio.get_running_loop()
    config = uvicorn.Config(app, log_config=None, proxy_headers=False, lifespan="off", limit_concurrency=limit)
    config.load()
    state = ServerState()
    http = type("KeepAliveHttp10", (KeepAliveHttp10,), {"head_timeout": 60.0, "idle_timeout": idle})
    protocol = http(config=config, server_state=state, app_state={}, _loop=loop)
    server_side, client_side = socket.socketpair()
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, server_side)
    reader, writer = await asyncio.open_connection(sock=client_side)
    try:
        yield Client(protocol, reader, state)
    finally:
        writer.close()
        transport.close()


def head(size: int, method: str = "GET", path: str = "/", headers: str = "Connection: close\r\n") -> bytes:
    """A request head of exactly ``size`` bytes, its blank line included."""
    start = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}X-Pad: ".encode()
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


SERVED = [(200, b"GET / 0")]
TOO_LARGE = 431


def split(data: bytes, *cuts: int) -> list[bytes]:
    """``data`` cut at these offsets (negative: from the end)."""
    at = [0, *(c % len(data) for c in cuts), len(data)]
    return [data[a:b] for a, b in zip(at, at[1:], strict=False)]


# How reads may split a head: whole, its blank line cut at each of its
# places, and in 1 KiB reads.
SPLITS = {
    "one read": (),
    "cut before its blank line's last byte": (-1,),
    "cut in its blank line's middle": (-2,),
    "cut after its blank line's first byte": (-3,),
    "cut before its blank line": (-4,),
    "1 KiB reads": tuple(range(1024, LIMIT, 1024)),
}


@pytest.mark.parametrize("cuts", SPLITS.values(), ids=SPLITS.keys())
async def test_a_head_of_the_limit_is_served_and_one_byte_more_refused_however_it_is_read(cuts):
    async with connection() as client:
        client.reads(*split(head(LIMIT), *cuts))
        assert await client.answers() == SERVED
    async with connection() as client:
        client.reads(*split(head(LIMIT + 1), *cuts))
        [(status, body)] = await client.answers()
        assert status == TOO_LARGE and orjson.loads(body)["error"] == "headers_too_large"


@pytest.mark.parametrize("cuts", SPLITS.values(), ids=SPLITS.keys())
async def test_the_body_read_with_a_head_is_not_counted_in_it(cuts):
    body = b"b" * 1000
    request = head(LIMIT, "POST", headers=f"Content-Length: {len(body)}\r\nConnection: close\r\n") + body
    async with connection() as client:
        client.reads(*split(request, *(c - len(body) for c in cuts if c < 0)))  # the body with the head's end
        assert await client.answers() == [(200, b"POST / 1000")]


async def test_a_head_too_large_after_a_request_in_the_same_read_is_refused_after_its_answer():
    first = b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
    async with connection() as client:
        client.reads(first + head(LIMIT + 1))
        answers = await client.answers()
        assert [status for status, _ in answers] == [200, TOO_LARGE] and answers[0][1] == b"GET /first 0"


async def test_a_head_too_large_after_a_body_in_the_same_read_is_refused_after_its_answer():
    post = b"POST /first HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
    async with connection() as client:
        client.reads(post + head(LIMIT + 1))
        answers = await client.answers()
        assert [status for status, _ in answers] == [200, TOO_LARGE] and answers[0][1] == b"POST /first 3"


async def test_heads_of_the_limit_one_after_another_in_one_read_are_all_served():
    keep = head(LIMIT, path="/a", headers="")
    async with connection() as client:
        client.reads(keep + keep + head(LIMIT))
        assert await client.answers() == [(200, b"GET /a 0"), (200, b"GET /a 0"), *SERVED]


@pytest.mark.parametrize("request_head", [
    b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n",
    b"POST /v1/messages HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n",
], ids=["HTTP/1.1", "HTTP/1.0 keep-alive"])
async def test_past_the_connection_limit_requests_get_503_json_and_probes_are_served(request_head):
    async with connection(limit=3) as client:
        client.state.connections.update({object(), object()})  # with this one: 3, the limit
        client.reads(request_head + b"{}")
        data = await asyncio.wait_for(client.reader.read(), PATIENCE)
        status, _, body = data.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 503 ")
        assert b"\r\ncontent-type: application/json\r\n" in status and b"\r\nretry-after: 1\r\n" in status
        assert re.findall(rb"\r\nconnection: ([^\r]*)", status) == [b"close"]
        assert orjson.loads(body) == {"error": "overloaded",
                                      "message": "this process is at its connection limit; retry"}
    for probe in ("/healthz", "/readyz", "/metrics", "http://x/healthz?full=1"):
        async with connection(limit=3) as client:
            client.state.connections.update({object(), object()})
            client.reads(f"GET {probe} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            path = probe.removeprefix("http://x").partition("?")[0]
            assert await client.answers() == [(200, f"GET {path} 0".encode())]
    async with connection(limit=3) as client:
        client.state.connections.add(object())  # under the limit: served
        client.reads(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        assert await client.answers() == [(200, b"POST /v1/messages 2")]


async def test_a_connection_that_sends_nothing_is_closed_with_nothing_said():
    async with connection(idle=0.2 * S) as client:
        assert await asyncio.wait_for(client.reader.read(), PATIENCE) == b""
