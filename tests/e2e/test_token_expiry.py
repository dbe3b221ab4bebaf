"""A WebSocket lives as long as its token: closed with 4001 at `exp`, and a
client that renews (a new token, `since` = the last id it got) loses nothing."""

from __future__ import annotations

import asyncio
import time

import httpx
import jwt
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests.e2e.helpers import connect, nothing_more, post, receive

HEARTBEAT_TICK = 1.0  # the shared system's (CHAT_PING_INTERVAL_SECONDS 20: the tick's cap, 1 s)


async def test_a_websocket_is_closed_with_4001_at_exp_and_a_renewed_one_resumes_exactly(system, users):
    alice, bob = users("alice"), users("bob")
    exp = int(time.time()) + 3
    short = jwt.encode({"sub": bob, "exp": exp}, system.secret, algorithm="HS256")
    ws = await websockets.connect(f"{system.ws_url}/v1/ws?token={short}")
    assert (await receive(ws, 1))[0]["type"] == "hello"
    first = (await post(system, alice, bob, "before exp")).json()
    assert (await receive(ws, 1))[0]["id"] == first["id"]  # a live socket until exp

    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), exp - time.time() + HEARTBEAT_TICK + 2)
    closed_at = time.time()
    assert closed.value.rcvd.code == 4001
    assert closed.value.rcvd.reason == "token expired: reconnect with a new token and since"
    assert exp - 0.1 <= closed_at <= exp + HEARTBEAT_TICK + 0.5

    missed = [(await post(system, alice, bob, f"while away {i}")).json() for i in range(3)]
    renewed, hello = await connect(system, bob, since=first["id"])  # a fresh token
    assert hello["recovered"] is True
    assert await receive(renewed, 3) == missed  # each once, in order
    assert await nothing_more(renewed)
    await renewed.close()


async def test_a_poll_with_an_expired_token_is_refused(system, users):
    expired = jwt.encode({"sub": users("bob"), "exp": int(time.time()) - 1}, system.secret, algorithm="HS256")
    async with httpx.AsyncClient() as client:
        reply = await client.get(system.poll_url, params={"token": expired, "timeout": 0})
    assert reply.status_code == 401 and reply.json() == {"error": "unauthorized", "message": "token expired"}
