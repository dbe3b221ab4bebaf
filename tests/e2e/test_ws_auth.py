"""Where a client's token travels: never in the URL by default (proxies write
a URL whole to their error logs, browsers to their history), in
``Authorization`` where the client can set headers, and for a browser's
WebSocket in its first frame, ``{"type": "auth", "token": ...}``."""

import asyncio
import json
import uuid

import httpx
import orjson
import pytest
import websockets

from chat.partitions import SlotMap
from tests.e2e.helpers import post, raw_exchange, receive
from harness.system import databases, private_system, running_system
from tests.timing import PATIENCE

ORIGIN = "http://app.example"


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """A system as deployed by default: URL tokens refused."""
    with private_system(tmp_path_factory.mktemp("ws-auth"), daemons=1, apis=1, CHAT_URL_TOKENS_ALLOWED="false",
                        CHAT_WS_AUTH_SECONDS="1", CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_ALLOWED_ORIGINS=json.dumps([ORIGIN])) as s:
        yield s


async def close_of(ws) -> tuple[int, str]:
    """The close code and reason the server ended ``ws`` with, once it has."""
    with pytest.raises(websockets.ConnectionClosed) as closed:
        async with asyncio.timeout(PATIENCE):
            while True:
                await ws.recv()
    assert closed.value.rcvd is not None, "the server sent no close frame"
    return closed.value.rcvd.code, closed.value.rcvd.reason


def test_a_token_in_the_url_is_refused_with_401_by_default(strict):
    token = strict.token(f"u-{uuid.uuid4().hex[:8]}")
    status, headers, body = raw_exchange(strict.daemon_port, (
        f"GET /v1/ws?token={token} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    assert status == b"HTTP/1.1 401 Unauthorized" and headers["www-authenticate"] == "Bearer"
    assert orjson.loads(body)["error"] == "unauthorized" and "URL" in orjson.loads(body)["message"]
    poll = httpx.get(f"{strict.poll_url}?token={token}&timeout=0", timeout=PATIENCE)
    assert poll.status_code == 401 and "URL" in poll.json()["message"]


async def test_the_token_in_an_auth_frame_opens_the_stream(strict):
    bob = f"bob-{uuid.uuid4().hex[:8]}"
    async with websockets.connect(f"{strict.ws_url}/v1/ws", origin=ORIGIN) as ws:
        await ws.send(orjson.dumps({"type": "auth", "token": strict.token(bob)}).decode())
        hello = (await receive(ws, 1))[0]
        assert hello["type"] == "hello" and hello["user"] == bob
        r = await post(strict, "alice", bob, "after an auth frame")
        assert r.status_code == 201
        assert (await receive(ws, 1))[0]["body"] == "after an auth frame"


async def test_the_token_in_authorization_opens_the_stream_and_the_poll(strict):
    bob = f"bob-{uuid.uuid4().hex[:8]}"
    headers = {"Authorization": f"Bearer {strict.token(bob)}"}
    async with websockets.connect(f"{strict.ws_url}/v1/ws", additional_headers=headers) as ws:
        assert (await receive(ws, 1))[0]["user"] == bob
    assert (await post(strict, "alice", bob, "polled")).status_code == 201
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        answer = await client.get(f"{strict.poll_url}?since=0", headers=headers)  # answered once it has one
    assert answer.status_code == 200 and [m["body"] for m in answer.json()["messages"]] == ["polled"]


@pytest.mark.parametrize("first", [
    b"not json", b'{"type": "hello"}', b'{"type": "auth"}', b'{"type": "auth", "token": 7}', b"[]",
    b'{"type": "auth", "token": "eyJhbGciOiJIUzI1NiJ9.e30.forged"}',
])
async def test_a_first_frame_that_is_no_valid_auth_closes_with_4401(strict, first):
    async with websockets.connect(f"{strict.ws_url}/v1/ws") as ws:
        await ws.send(first.decode())
        code, reason = await close_of(ws)
    assert code == 4401 and reason


async def test_no_auth_frame_within_ws_auth_seconds_closes_with_4401(strict):
    async with websockets.connect(f"{strict.ws_url}/v1/ws") as ws:
        code, reason = await close_of(ws)  # CHAT_WS_AUTH_SECONDS=1 here
    assert code == 4401 and "no auth frame" in reason


async def test_an_expired_token_in_the_auth_frame_closes_with_4401(strict):
    async with websockets.connect(f"{strict.ws_url}/v1/ws") as ws:
        await ws.send(orjson.dumps({"type": "auth", "token": strict.token("carol", ttl=-10)}).decode())
        code, reason = await close_of(ws)
    assert code == 4401 and "expired" in reason


def test_a_browser_s_preflight_of_the_poll_allows_authorization_for_allowed_origins_only(strict):
    def preflight(origin: str) -> httpx.Response:
        return httpx.options(strict.poll_url, timeout=PATIENCE, headers={
            "Origin": origin, "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "authorization"})

    allowed = preflight(ORIGIN)
    assert allowed.status_code == 204 and allowed.headers["access-control-allow-origin"] == ORIGIN
    assert allowed.headers["access-control-allow-headers"] == "Authorization"
    assert allowed.headers["access-control-allow-methods"] == "GET"
    refused = preflight("http://evil.example")
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    other = httpx.post(strict.poll_url, timeout=PATIENCE)
    assert other.status_code == 405 and other.headers["allow"] == "GET, OPTIONS"


@pytest.fixture
def partition_0_only(tmp_path):
    """Two partitions, and a daemon that serves partition 0 alone."""
    with databases(tmp_path, partitions=2) as dbs, \
            running_system(dbs, daemons=1, apis=0, CHAT_URL_TOKENS_ALLOWED="false", CHAT_DAEMON_PARTITIONS="0") as s:
        yield s


async def test_an_auth_frame_of_a_user_served_elsewhere_closes_with_4421_and_the_partition(partition_0_only):
    two = SlotMap.even(2)
    while two.partition_of(user := f"u-{uuid.uuid4().hex[:8]}") != 1:
        pass
    async with websockets.connect(f"{partition_0_only.ws_url}/v1/ws") as ws:
        await ws.send(orjson.dumps({"type": "auth", "token": partition_0_only.token(user)}).decode())
        code, reason = await close_of(ws)
    assert code == 4421 and orjson.loads(reason) == {"partition": 1}
