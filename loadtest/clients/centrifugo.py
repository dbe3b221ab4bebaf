"""Centrifugo v5.4.9 as the peer system of a benchmark: its config, its start,
its connection tokens, the client side of its JSON protocol over WebSocket,
and a batch publisher for its server HTTP API.

The binary comes from ``scripts/install-centrifugo.sh``. Every key below was
checked against v5.4.9's own defaults table (``main.go``): Centrifugo ignores
keys it does not know, so a misspelt one would silently change the benchmark.

The protocol, as a raw-socket client sees it (``GET /connection/websocket``):

- the client sends ``{"id":1,"connect":{"token":...}}``;
- the server answers ``{"id":1,"connect":{...,"subs":{"#u":{}}}}`` or
  ``{"id":1,"error":{"code":..,"message":..}}``; a token it cannot verify
  closes the socket instead (close code 3500, "invalid token");
- each publication on a subscribed channel is ``{"push":{"channel":..,"pub":{"data":..}}}``;
- a server ping is an empty ``{}``; the client answers ``{}`` before the pong
  timeout or is disconnected;
- the server may put several replies in one text frame, one per line.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import orjson
from harness.servers import ROOT

BIN = ROOT / ".cache" / "centrifugo" / "bin" / "centrifugo"
VERSION = "5.4.9"
CONNECT_ID = 1  # the only command a load client sends with an id, so its reply is recognisable
PING = b"{}"  # a server ping, and equally the client's pong
PING_SECONDS = 120  # as our daemons are run in benchmarks (CHAT_PING_INTERVAL_SECONDS=120)


def personal_channel(user: str) -> str:
    """The channel ``user_subscribe_to_personal`` puts a user's connections in: with no
    ``user_personal_channel_namespace`` it is the user boundary (``#``) then the user id."""
    return "#" + user


def config(port: int, secret: str, api_key: str, ping_seconds: int = PING_SECONDS) -> dict[str, Any]:
    """The config file's contents. Anything not set keeps v5.4.9's default, so the
    top-level channel options stay off: no history, no recovery, no presence, no
    join/leave; a publication is delivered to the connections present and that is all."""
    return {
        "address": "127.0.0.1",
        # A string, as the default is: viper reads it with GetString either way.
        "port": str(port),
        # The default engine; spelled out since the benchmark is about it (no Redis, one node).
        "engine": "memory",
        # HS256 connection tokens signed with this secret; ``sub`` is the user id.
        "token_hmac_secret_key": secret,
        # The server API (/api/...) on the same port demands this in the X-API-Key header.
        "api_key": api_key,
        # Each connection of user U is subscribed server-side to "#U" at connect:
        # the client sends nothing but the connect command, as ours sends nothing.
        "user_subscribe_to_personal": True,
        # Durations are Go strings ("120s"): a bare number fails to parse and aborts the start.
        # The first ping comes at a random point in [interval/2, interval] after connect.
        # pong_timeout (default 8s) must stay below ping_interval, or Centrifugo exits.
        "ping_interval": f"{ping_seconds}s",
        "pong_timeout": "8s",
        "log_level": "error",
        # /health (off by default) is what start() polls.
        "health": True,
        # No anonymous usage report to Centrifugo's servers from a benchmark run.
        "usage_stats_disable": True,
        # allowed_origins is left empty: Centrifugo then admits any request without an
        # Origin header, which is what non-browser load clients send.
    }


def start(workdir: Path, port: int, secret: str, api_key: str, timeout: float = 30.0,
          ping_seconds: int = PING_SECONDS) -> subprocess.Popen:
    """Starts Centrifugo on ``port`` and returns once /health answers 200."""
    if not BIN.exists():
        raise FileNotFoundError(f"{BIN} is missing: run scripts/install-centrifugo.sh")
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "config.json"
    conf.write_bytes(orjson.dumps(config(port, secret, api_key, ping_seconds), option=orjson.OPT_INDENT_2))
    # GOMAXPROCS unset: the Go runtime then uses every core, as it would in production.
    env = {k: v for k, v in os.environ.items() if k != "GOMAXPROCS"}
    log = (workdir / "centrifugo.log").open("ab")
    proc = subprocess.Popen([str(BIN), "--config", str(conf)], cwd=workdir, env=env,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()  # the child holds its own copy
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"centrifugo exited with {proc.returncode}; see {workdir / 'centrifugo.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                if resp.status == 200:
                    return proc
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"centrifugo did not answer /health on port {port} within {timeout}s")
        time.sleep(0.05)


def token(secret: str, user: str, ttl_seconds: int = 3600) -> str:
    """An HS256 connection JWT: Centrifugo takes the user id from ``sub`` and, with
    ``exp`` set, disconnects the client once it passes (so make it outlast the run)."""
    return jwt.encode({"sub": user, "exp": int(time.time()) + ttl_seconds}, secret, algorithm="HS256")


def connect_command(token: str) -> bytes:
    """The first text frame a client sends; no ``subs``: the personal channel comes from the server."""
    return orjson.dumps({"id": CONNECT_ID, "connect": {"token": token}})


def parse_frame(payload: bytes) -> tuple[list[Any], bool, bool | None]:
    """One server text frame: the ``data`` of each publication in it, whether it held a
    ping (to be answered with ``{}``), and the connect reply's outcome: True (connected),
    False (an error reply), None (no connect reply in this frame)."""
    if payload == PING:  # by far the commonest non-publication frame: no parse
        return [], True, None
    pubs: list[Any] = []
    ping = False
    connected: bool | None = None
    for line in payload.split(b"\n"):
        if not line:
            continue
        reply = orjson.loads(line)
        if not reply:
            ping = True
            continue
        push = reply.get("push")
        if push is not None:
            pub = push.get("pub")
            if pub is not None:
                pubs.append(pub.get("data"))
        elif reply.get("id") == CONNECT_ID:
            connected = "connect" in reply and "error" not in reply
    return pubs, ping, connected


def publications(payload: bytes) -> tuple[list[Any], bool]:
    """The publications' data in one frame, and whether it held a ping."""
    pubs, ping, _ = parse_frame(payload)
    return pubs, ping


def connect_reply_ok(payload: bytes) -> bool | None:
    """True / False if the frame holds the connect reply (success / error), else None."""
    return parse_frame(payload)[2]


def batch_body(batch: list[tuple[str, Any]], parallel: bool = False) -> bytes:
    """The body of one ``POST /api/batch``: a publish command per (channel, data).
    Without ``parallel`` Centrifugo runs the commands in order in the request's goroutine."""
    body: dict[str, Any] = {"commands": [{"publish": {"channel": ch, "data": data}} for ch, data in batch]}
    if parallel:
        body["parallel"] = True
    return orjson.dumps(body)


def batch_errors(reply: bytes, commands: int) -> int:
    """How many commands of a batch failed, from the reply ``{"replies":[{"publish":{}},
    {"error":{"code":..,"message":..}},...]}``. A reply that does not account for every
    command counts them all as failed."""
    try:
        replies = orjson.loads(reply).get("replies") or []
    except (orjson.JSONDecodeError, AttributeError):
        return commands
    if len(replies) != commands:
        return commands
    return sum(1 for r in replies if "error" in r)


async def publish_batches(api_url: str, api_key: str, batches: AsyncIterator[list[tuple[str, Any]]],
                          concurrency: int = 1, parallel: bool = False) -> dict[str, int]:
    """Posts each batch as one request to ``{api_url}/api/batch`` over keep-alive
    connections, at most ``concurrency`` requests in flight (our feed, likewise, does
    not wait for one oplog batch to be delivered before handing over the next).
    Returns counts: requests, published (commands sent), errors (failed commands,
    including every command of a request that failed as a whole)."""
    counts = {"requests": 0, "published": 0, "errors": 0}
    gate = asyncio.Semaphore(concurrency)
    tasks: set[asyncio.Task[None]] = set()
    headers = {"X-API-Key": api_key, "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def post(body: bytes, n: int) -> None:
            try:
                async with session.post(f"{api_url}/api/batch", data=body) as resp:
                    reply = await resp.read()
                    counts["errors"] += batch_errors(reply, n) if resp.status == 200 else n
            except aiohttp.ClientError:
                counts["errors"] += n
            finally:
                gate.release()

        async for batch in batches:
            if not batch:
                continue
            await gate.acquire()
            counts["requests"] += 1
            counts["published"] += len(batch)
            task = asyncio.create_task(post(batch_body(batch, parallel), len(batch)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    return counts
