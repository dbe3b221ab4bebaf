"""What the web page needs from the API and the daemons: the conversation list,
client-config, dev login (off unless CHAT_DEV_LOGIN), the page itself, and
CORS on the long poll for allowed origins."""

import asyncio

import httpx

from tests.e2e.helpers import post
from tests.timing import PATIENCE


async def test_conversations_newest_first_with_the_last_message(system, users):
    alice, bob, carol = users("alice"), users("bob"), users("carol")
    await post(system, alice, bob, "a->b 1")
    await post(system, carol, alice, "c->a")
    last_bob = (await post(system, bob, alice, "b->a")).json()
    await post(system, bob, carol, "not alice's")
    reply = httpx.get(f"{system.api_url}/v1/conversations", headers={"Authorization": f"Bearer {system.token(alice)}"})
    assert reply.status_code == 200
    convs = reply.json()["conversations"]
    assert [c["with"] for c in convs] == [bob, carol]
    assert convs[0]["last"] == last_bob
    assert convs[1]["last"]["body"] == "c->a"


async def test_conversations_are_capped_at_50_and_need_a_token(system, users):
    alice = users("alice")
    async with httpx.AsyncClient(timeout=PATIENCE) as c:
        replies = await asyncio.gather(*(post(system, alice, users(f"p{i}"), "hi", client=c) for i in range(52)))
    assert all(r.status_code == 201 for r in replies)
    reply = httpx.get(f"{system.api_url}/v1/conversations", headers={"Authorization": f"Bearer {system.token(alice)}"})
    assert len(reply.json()["conversations"]) == 50
    assert httpx.get(f"{system.api_url}/v1/conversations").status_code == 401


def test_dev_login_is_off_by_default(system):
    reply = httpx.post(f"{system.api_url}/v1/dev/token", json={"user": "alice"})
    assert reply.status_code == 404 and reply.json()["error"] == "not_found"
    assert httpx.get(f"{system.api_url}/v1/client-config").json()["dev_login"] is False


def test_client_config_points_at_the_daemons(system):
    config = httpx.get(f"{system.api_url}/v1/client-config").json()
    assert config == {"ws_url": f"{system.ws_url}/v1/ws", "poll_url": system.poll_url, "dev_login": False}


def test_the_page_is_served_and_slash_redirects_to_it(system):
    home = httpx.get(f"{system.api_url}/")
    assert home.status_code == 307 and home.headers["location"] == "/app/"
    page = httpx.get(f"{system.api_url}/app/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for name in ("chat-client.js", "app.js"):
        module = httpx.get(f"{system.api_url}/app/{name}")
        assert module.status_code == 200 and "javascript" in module.headers["content-type"]
    missing = httpx.get(f"{system.api_url}/app/nope.js")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_poll_lets_allowed_origins_read_it_and_refuses_others_as_the_websocket_does(system, users):
    token = system.token(users("bob"))
    allowed = "http://127.0.0.1:8000"  # in the default CHAT_ALLOWED_ORIGINS
    reply = httpx.get(system.poll_url, params={"token": token, "timeout": 0}, headers={"Origin": allowed})
    assert reply.status_code == 200
    assert reply.headers["access-control-allow-origin"] == allowed and reply.headers["vary"] == "Origin"
    refusal = {"error": "origin_not_allowed", "message": "origin 'http://evil.test' is not allowed"}
    other = httpx.get(system.poll_url, params={"token": token, "timeout": 0}, headers={"Origin": "http://evil.test"})
    assert other.status_code == 403 and other.json() == refusal
    assert "access-control-allow-origin" not in other.headers
    handshake = httpx.get(f"http://127.0.0.1:{system.daemon_port}/v1/ws", params={"token": token}, headers={
        "Origin": "http://evil.test", "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    assert handshake.status_code == 403 and handshake.json() == refusal
    # no Origin: not a browser
    assert httpx.get(system.poll_url, params={"token": token, "timeout": 0}).status_code == 200
