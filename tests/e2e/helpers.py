"""Small async helpers the e2e tests share: a real HTTP client, a real WebSocket client,
a writer on the real databases, and a count of a function's calls."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid

import httpx
import orjson
import pymongo
import websockets
from sqlalchemy import create_engine, text

from chat.partitions import SlotMap, collection_name, suffix
from db import mongo
from db.sql import make_engine
from writer.message_writer import MessageWriter
from harness.system import Databases, System
from tests.frame_contract import violations
from tests.timing import PATIENCE, eventually


@contextlib.asynccontextmanager
async def writer_stores(dbs, event_listeners: list | None = None):
    """A MySQL engine and a Mongo database of their own, as a writer process has; yields
    (engine, Mongo database). ``event_listeners``: pymongo listeners on that client."""
    settings = dbs.settings()
    engine = make_engine(settings.stores.mysql_url.get_secret_value(), 5)
    client = mongo.make_client(settings.stores.mongo_url.get_secret_value(), 5, event_listeners)
    try:
        yield engine, client[settings.stores.mongo_db]
    finally:
        engine.dispose()
        await client.close()


@contextlib.asynccontextmanager
async def running_writer(dbs, writer_class=MessageWriter, event_listeners: list | None = None, **options):
    """A running writer on ``writer_stores``; yields (writer, engine, Mongo database)."""
    options = {"batch_max": 50, "window_ms": 2, "queue_max": 100, "timeout_seconds": 5,
               "retention_seconds": 86_400, **options}
    async with writer_stores(dbs, event_listeners) as (engine, db):
        writer = writer_class(engine, db, **options)
        task = asyncio.create_task(writer.run(repair_every=0.2))
        try:
            yield writer, engine, db
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            writer.close()


def count_calls(monkeypatch, owner, name: str) -> list:
    """Replaces async ``owner.name`` with one that records each call's arguments."""
    calls = []
    real = getattr(owner, name)

    async def counted(*args):
        calls.append(args)
        return await real(*args)

    monkeypatch.setattr(owner, name, counted)
    return calls


async def post(system: System, sender: str, to: str, body: str, client_msg_id: str | None = None,
               client: httpx.AsyncClient | None = None) -> httpx.Response:
    payload = {"to": to, "body": body}
    if client_msg_id is not None:
        payload["client_msg_id"] = client_msg_id
    headers = {"Authorization": f"Bearer {system.token(sender)}"}
    if client is not None:
        return await client.post(f"{system.api_url}/v1/messages", json=payload, headers=headers)
    async with httpx.AsyncClient(timeout=PATIENCE) as c:
        return await c.post(f"{system.api_url}/v1/messages", json=payload, headers=headers)


async def connect(system: System, user: str, since: str | None = None, **kwargs):
    """Opens /v1/ws as ``user``; returns (websocket, hello frame)."""
    url = f"{system.ws_url}/v1/ws" + (f"?since={since}" if since else "")
    headers = {"Authorization": f"Bearer {system.token(user)}"}  # not in the URL: proxies log URLs
    ws = await websockets.connect(url, additional_headers=headers, **kwargs)
    hello = orjson.loads(await asyncio.wait_for(ws.recv(), PATIENCE))
    assert hello["type"] == "hello"
    assert violations(hello) == []  # as the AsyncAPI document has it
    return ws, hello


async def receive(ws, count: int, timeout: float = PATIENCE) -> list[dict]:
    frames = []
    async with asyncio.timeout(timeout):
        while len(frames) < count:
            frames.append(orjson.loads(await ws.recv()))
            assert violations(frames[-1]) == []  # as the AsyncAPI document has it
    return frames


async def until_closed(ws) -> list[dict]:
    """Every frame ``ws`` gets until the daemon closes it."""
    frames = []
    with contextlib.suppress(websockets.ConnectionClosed):
        while True:
            frames.append(orjson.loads(await asyncio.wait_for(ws.recv(), PATIENCE)))
            assert violations(frames[-1]) == []  # as the AsyncAPI document has it
    return frames


async def nothing_more(system: System, ws, user: str, peer: str | None = None) -> list[dict]:
    """The frames ``ws`` (a socket of ``user``) still had coming before a marker
    message posted now from ``user`` to ``peer``; [] means nothing more. A barrier,
    not a wait for silence: a user's frames come in order, so a duplicate or a
    stray that was on its way comes before the marker. ``peer`` must share the
    stream (the partition) of whatever the test waits not to see."""
    marker = f"marker-{uuid.uuid4().hex}"
    r = await post(system, user, peer or "marker.peer", "marker", client_msg_id=marker)
    assert r.status_code == 201, r.text
    before = []
    while (frame := (await receive(ws, 1))[0]).get("client_msg_id") != marker:
        before.append(frame)
    return before


def mysql_rows(system: System, where: str, **params) -> list:
    return partition_rows(system.dbs, 0, where, **params)


def mongo_docs(system: System, query: dict) -> list[dict]:
    return partition_docs(system.dbs, 0, query)


def partition_rows(dbs: Databases, partition: int, where: str = "1", **params) -> list:
    """The rows of ``partition``'s messages table that match ``where``, by id."""
    engine = create_engine(dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return conn.execute(text(f"SELECT * FROM messages{suffix(partition)} WHERE {where} ORDER BY id"),
                                params).all()
    finally:
        engine.dispose()


def partition_docs(dbs: Databases, partition: int, query: dict) -> list[dict]:
    """The documents of ``partition``'s collection that match ``query``, by id."""
    client = pymongo.MongoClient(dbs.ferretdb.url, tz_aware=True)
    try:
        return list(client["chat"][collection_name(partition)].find(query).sort("_id", 1))
    finally:
        client.close()


def user_in(partition: int, name: str, slot_map: SlotMap) -> str:
    """A fresh user id of ``partition`` under ``slot_map`` (its slot decides: chat.partitions.slot_of)."""
    tag = uuid.uuid4().hex[:6]
    return next(u for i in range(10_000) if slot_map.partition_of(u := f"{name}{i}-{tag}") == partition)


async def mongo_docs_soon(system: System, query: dict, count: int, timeout: float = PATIENCE) -> list[dict]:
    """The documents once ``count`` of them are in Mongo: a 201 means stored
    in MySQL, and the copy to the fast store follows within milliseconds."""
    await eventually(lambda: len(mongo_docs(system, query)) >= count, f"{count} documents match {query}", timeout)
    return mongo_docs(system, query)


@contextlib.asynccontextmanager
async def api_in_process(settings):
    """The write API app, run in this process and its event loop (its lifespan
    included), with an httpx client bound to it: for tests that need to reach
    into the loop the app runs on."""
    from api.app import create_app

    app = create_app(settings)
    started, stop = asyncio.Event(), asyncio.Event()
    sent: list[dict] = []

    async def receive():
        if not started.is_set():
            started.set()
            return {"type": "lifespan.startup"}
        await stop.wait()
        return {"type": "lifespan.shutdown"}

    async def send(message):
        sent.append(message)

    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    try:
        await eventually(lambda: sent, "the app's lifespan answered its start-up")
        assert sent[0]["type"] == "lifespan.startup.complete", sent
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            yield client
    finally:
        stop.set()
        await lifespan


def raw_exchange(port: int, request: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Sends raw bytes; returns the status line, headers and body of the answer,
    once the server has closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    return status, {k.decode().lower(): v.decode() for k, _, v in (line.partition(b": ") for line in lines)}, body
