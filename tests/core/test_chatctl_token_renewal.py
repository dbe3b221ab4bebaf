"""The reference client's token renewal (chatctl.client.listen) against a WebSocket
server in this process that plays the daemon: a 4001 close once a token expires,
a 401 answer to a token that expired before its handshake."""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import orjson
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request

from chatctl.client import listen
from tests.timing import S


def query_of(request: Request) -> dict[str, str]:
    """The handshake's query, and as "token" its ``Authorization`` token (never in the URL)."""
    query = {k: v[0] for k, v in parse_qs(urlsplit(request.path).query).items()}
    assert "token" not in query, "a token in the URL lands in proxies' logs"
    return query | {"token": request.headers["Authorization"].removeprefix("Bearer ")}


class FakeDaemon:
    """Refuses the tokens in ``expired`` with 401; on each connection, a hello and
    the next message of ``script`` after the client's ``since``, then a 4001 close
    while ``close_with_4001`` holds tokens to close."""

    def __init__(self, expired: set[str], close_with_4001: set[str]):
        self.expired = expired
        self.close_with_4001 = close_with_4001
        self.asked: list[dict[str, str]] = []  # each handshake's query, refused ones included

    def process_request(self, connection: ServerConnection, request: Request):
        query = query_of(request)
        self.asked.append(query)
        if query["token"] in self.expired:
            return connection.respond(HTTPStatus.UNAUTHORIZED, '{"error":"unauthorized"}')
        return None

    async def handler(self, connection: ServerConnection) -> None:
        assert connection.request is not None
        query = query_of(connection.request)
        after = int(query.get("since", "0"))
        await connection.send(orjson.dumps({"type": "hello", "cursor": str(after), "recovered": True}).decode())
        await connection.send(orjson.dumps({"type": "message", "id": str(after + 1), "body": f"m{after + 1}"}).decode())
        if query["token"] in self.close_with_4001:
            await connection.close(4001, "token expired: reconnect with a new token and since")
        else:
            await connection.wait_closed()


async def run(daemon: FakeDaemon, first_token: str, count: int) -> tuple[list[dict], list[str], list[float]]:
    """What the client printed, why it renewed, and the backoffs it waited."""
    printed, renewals, slept = [], [], []
    tokens = iter(f"t{n}" for n in range(1, 100))

    def renew(why: str) -> str:
        renewals.append(why)
        return next(tokens)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async with serve(daemon.handler, "127.0.0.1", 0, process_request=daemon.process_request) as server:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(10 * S):
            await listen(f"ws://127.0.0.1:{port}", first_token, None, printed.append, count, renew=renew,
                         sleep=sleep)
    return printed, renewals, slept


async def test_a_4001_close_mints_a_new_token_and_resumes_at_once_from_the_last_cursor():
    daemon = FakeDaemon(expired=set(), close_with_4001={"t0"})
    printed, renewals, slept = await run(daemon, "t0", count=2)
    assert [m["body"] for m in printed] == ["m1", "m2"]  # m1 once: the new socket resumed after it
    assert renewals == ["closed with 4001"]
    assert [(q["token"], q.get("since")) for q in daemon.asked] == [("t0", None), ("t1", "1")]
    assert slept == []  # no backoff: the token was the only thing wrong


async def test_a_401_at_the_handshake_mints_a_new_token_after_a_backoff():
    # A token that expired while the client was away (a daemon restart, a long backoff):
    # refused before any socket opens, so no 4001 ever comes.
    daemon = FakeDaemon(expired={"t0"}, close_with_4001=set())
    printed, renewals, slept = await run(daemon, "t0", count=1)
    assert [m["body"] for m in printed] == ["m1"]
    assert renewals == ["refused with 401"]
    assert [q["token"] for q in daemon.asked] == ["t0", "t1"]
    assert len(slept) == 1  # a secret that is wrong is not asked again at once


async def test_without_renew_a_401_tries_the_same_token_again_after_a_backoff():
    daemon = FakeDaemon(expired={"t0"}, close_with_4001=set())
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            daemon.expired.clear()  # e.g. the daemon's clock was behind

    async with serve(daemon.handler, "127.0.0.1", 0, process_request=daemon.process_request) as server:
        port = server.sockets[0].getsockname()[1]
        printed: list[dict] = []
        async with asyncio.timeout(10 * S):
            await listen(f"ws://127.0.0.1:{port}", "t0", None, printed.append, 1, sleep=sleep)
    assert [q["token"] for q in daemon.asked] == ["t0", "t0", "t0"]
    assert [m["body"] for m in printed] == ["m1"] and len(slept) == 2
