"""A WebSocket lives as long as its token: closed with 4001 at `exp`, and a
client that renews (a new token, `since` = the last id it got) loses nothing."""

from __future__ import annotations

import asyncio
import time

import httpx
import jwt
import orjson
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests.e2e.helpers import connect, nothing_more, post, receive
from tests.timing import PATIENCE


async def test_a_websocket_is_closed_with_4001_at_exp_and_a_renewed_one_resumes_exactly(system, users):
    # How soon after exp the heartbeat closes it (the first tick past it) is
    # shown on a fake clock (tests/core/test_heartbeats.py); here, that it does.
    alice, bob = users("alice"), users("bob")
    exp = int(time.time()) + 3  # time to connect and get one message first
    short = jwt.encode({"sub": bob, "exp": exp}, system.secret, algorithm="HS256")
    ws = await websockets.connect(f"{system.ws_url}/v1/ws?token={short}")
    assert (await receive(ws, 1))[0]["type"] == "hello"
    first = (await post(system, alice, bob, "before exp")).json()
    assert (await receive(ws, 1))[0]["id"] == first["id"]  # a live socket until exp

    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), exp - time.time() + PATIENCE)
    closed_at = time.time()
    assert closed.value.rcvd.code == 4001
    assert closed.value.rcvd.reason == "token expired: reconnect with a new token and since"
    assert closed_at >= exp - 0.1  # not before exp (converted to the daemon's monotonic clock: within 0.1 s)

    missed = [(await post(system, alice, bob, f"while away {i}")).json() for i in range(3)]
    renewed, hello = await connect(system, bob, since=first["id"])  # a fresh token
    assert hello["recovered"] is True
    assert await receive(renewed, 3) == missed  # each once, in order
    assert await nothing_more(system, renewed, bob) == []
    await renewed.close()


async def test_a_poll_with_an_expired_token_is_refused(system, users):
    expired = jwt.encode({"sub": users("bob"), "exp": int(time.time()) - 1}, system.secret, algorithm="HS256")
    async with httpx.AsyncClient() as client:
        reply = await client.get(system.poll_url, params={"token": expired, "timeout": 0})
    assert reply.status_code == 401 and reply.json() == {"error": "unauthorized", "message": "token expired"}


@pytest.mark.parametrize("exp", [10**400, "9999999999"], ids=["no float holds it", "a numeric string"])
async def test_a_token_whose_exp_is_no_numeric_date_gets_401_on_every_port(system, users, exp):
    bob = users("bob")
    token = jwt.encode({"sub": bob, "exp": exp}, system.secret, algorithm="HS256")
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        posted = await client.post(f"{system.api_url}/v1/messages", json={"to": users("alice"), "body": "x"},
                                   headers={"Authorization": f"Bearer {token}"})
        polled = await client.get(system.poll_url, params={"token": token, "timeout": 0})
    for reply in (posted, polled):
        assert reply.status_code == 401 and reply.json()["error"] == "unauthorized"
        assert reply.headers["content-type"].startswith("application/json")
    reader, writer = await asyncio.open_connection("127.0.0.1", system.daemon_port)
    writer.write(f"GET /v1/ws?token={token} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), PATIENCE)  # the daemon closes after a refused handshake
    writer.close()
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 401 ") and b"\r\nwww-authenticate: bearer" in status.lower()
    assert orjson.loads(body)["error"] == "unauthorized"
