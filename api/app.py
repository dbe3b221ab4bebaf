"""The write API: Starlette routes, and the lifespan that owns every pool."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pymongo.asynchronous.database import AsyncDatabase
from sqlalchemy import Executable, select, text
from sqlalchemy.engine import Connection, Engine, Row
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Scope

from api import metrics
from api.errors import ApiError
from api.asyncapi import document as asyncapi_document
from api.openapi import document
from api import devices, events, signals
from api.post_message import PostMessage, front, read_body
from api.ratelimit import RateLimiter
from api.state import State
from api.validation import parse_bearer, parse_dev_login, parse_history_query
from chat import auth
from chat.messages import Kind, Message
from chat.metrics_port import serve_metrics
from chat.partitions import LiveMap, SlotMap, suffix
from chat.settings import Settings
from chat.signal_store import SignalStore, connect
from chat.stopping import bounded
from db import mongo
from db.partition_map import load_slot_map, tables_of, watch_slot_map
from db.retention import run_sweeper
from db.conversation_state import peer_markers, read_markers_of, unread_by_peer
from db.sql import MAX_OVERFLOW, conversation_key, make_engine, pool_size_of
from db.threads import Threads
from oplog.wake import WakePublisher
from writer.echo_wake import EchoWakes, listen_for_echo_wakes
from writer.client import RemoteWriter
from writer.partitioned import PartitionedWriter, build, engine_pool_size

log = logging.getLogger("chat.api")
STATIC = Path(__file__).with_name("static")
CONVERSATIONS_MAX = 50
DEV_TOKEN_TTL_SECONDS = 12 * 3600

# One row per peer: the newest message of each conversation the user is in.
# Each branch is a loose index scan of (sender, recipient, id) or (recipient, sender, id).
CONVERSATIONS_SQL = """
    SELECT m.* FROM {messages} m JOIN (
        SELECT peer, MAX(id) AS id FROM (
            SELECT recipient AS peer, MAX(id) AS id FROM {messages} WHERE sender = :user AND kind = 0
            GROUP BY recipient
            UNION ALL
            SELECT sender AS peer, MAX(id) AS id FROM {messages} WHERE recipient = :user AND kind = 0
            GROUP BY sender
        ) AS ends GROUP BY peer ORDER BY id DESC LIMIT :limit
    ) AS newest ON m.id = newest.id
    ORDER BY m.id DESC
"""


@functools.cache
def conversations_sql(partition: int) -> Executable:
    """The conversation list's query on the partition's table (a user's partition holds
    every message the user sent or received: chat.partitions)."""
    return text(CONVERSATIONS_SQL.format(messages="messages" + suffix(partition)))


def json_response(data: object, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(data), status, headers, media_type="application/json")


def _state(request: Request) -> State:
    return request.app.state.chat


def authenticate(request: Request, settings: Settings) -> str:
    return parse_bearer(request.headers.get("authorization"), settings.auth.jwt_secret.get_secret_value())


async def _read(st: State, statement: Executable, params: dict | None = None) -> Sequence[Row]:
    """One statement's rows from MySQL (``State.read``), or a fast 503."""
    return await st.read(lambda conn: conn.execute(statement, params).all())


async def get_history(request: Request) -> Response:
    st = _state(request)
    user = authenticate(request, st.settings)
    peer, before, limit = parse_history_query(request.query_params)
    messages = tables_of(st.slot_map.partition_of(user)).messages
    query = (select(messages).where(messages.c.conversation == conversation_key(user, peer),
                                    messages.c.kind == Kind.MESSAGE)
             .order_by(messages.c.id.desc()).limit(limit + 1))
    if before is not None:
        query = query.where(messages.c.id < before)

    rows = await _read(st, query)
    page = [Message.from_row(r).to_public() for r in rows[:limit]]
    next_before = page[-1]["id"] if len(rows) > limit else None
    return json_response({"messages": page, "next_before": next_before})


async def get_conversations(request: Request) -> Response:
    st = _state(request)
    user = authenticate(request, st.settings)
    partition = st.slot_map.partition_of(user)

    def read(conn: Connection) -> tuple:
        rows = conn.execute(conversations_sql(partition), {"user": user, "limit": CONVERSATIONS_MAX}).all()
        return (rows, unread_by_peer(conn, partition, user), read_markers_of(conn, user),
                peer_markers(conn, partition, user))

    rows, unread, mine, theirs = await st.read(read)
    conversations = []
    for row in rows:
        msg = Message.from_row(row).to_public()
        peer = row.recipient if row.sender == user else row.sender
        marks = theirs.get(peer, {})
        conversations.append({"with": peer, "last": msg, "unread": unread.get(peer, 0),
                              "read_upto": _id_or_none(mine.get(peer)),
                              "peer_read_upto": _id_or_none(marks.get("read")),
                              "peer_delivered_upto": _id_or_none(marks.get("delivered"))})
    return json_response({"conversations": conversations})


def _id_or_none(value: int | None) -> str | None:
    return None if not value else str(value)


async def dev_token(request: Request) -> Response:
    """Development only (CHAT_DEV_LOGIN): a token for any user, no password."""
    st = _state(request)
    if not dev_login_on(st.settings):
        raise ApiError(404, "not_found", f"no route {request.url.path}")
    raw = await read_body(request.receive, request.headers.get("content-length"), st.settings.api.request_max_bytes)
    user = parse_dev_login(raw)
    token = auth.mint(st.settings.auth.jwt_secret.get_secret_value(), user, DEV_TOKEN_TTL_SECONDS)
    return json_response({"token": token, "user": user})


def dev_login_on(settings: Settings) -> bool:
    """Only on a development machine: `python -m api` refuses to start with dev login
    and no dev mode (chat.auth_config), and an app made another way serves none."""
    return settings.auth.dev_login and settings.auth.dev_mode


def daemon_urls(public_url: str, scheme: str, host: str, daemon_port: int) -> dict[str, str]:
    """The daemons' /v1/ws and /v1/poll as the page should call them: under ``public_url``
    (the proxy, in production), else on the page's own host at the daemon port."""
    base = public_url.rstrip("/")
    if not base:
        host = f"[{host}]" if ":" in host else host
        base = f"{'https' if scheme == 'https' else 'http'}://{host}:{daemon_port}"
    ws_base = "ws" + base.removeprefix("http")  # http -> ws, https -> wss
    return {"ws_url": f"{ws_base}/v1/ws", "poll_url": f"{base}/v1/poll"}


async def client_config(request: Request) -> Response:
    """Where the web page finds the daemons, and whether it may offer dev login. With the
    user's token (``Authorization: Bearer``) also the user's partition, for the page to
    route its /v1/ws and /v1/poll with ``?partition=k``: only to the user it speaks for
    (a bad token is a 401), and without a token the answer has no partition."""
    st = _state(request)
    settings = st.settings
    urls = daemon_urls(settings.api.public_daemon_url, request.url.scheme, request.url.hostname or settings.api.host,
                       settings.daemon.port)
    config: dict[str, object] = {**urls, "dev_login": dev_login_on(settings)}
    if request.headers.get("authorization") is not None:
        config["partition"] = st.slot_map.partition_of(authenticate(request, settings))
    return json_response(config)


async def home(request: Request) -> Response:
    return RedirectResponse("/app/", 307)


async def healthz(request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    st = _state(request)
    checks = {}

    def mysql_ping() -> None:
        with st.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    try:
        await asyncio.wait_for(st.reads.run(mysql_ping), st.settings.stores.db_timeout_seconds)
        checks["mysql"] = "ok"
    except Exception as exc:
        checks["mysql"] = f"down: {exc.__class__.__name__}"
    try:
        await asyncio.wait_for(st.mongo_client.admin.command("ping"), st.settings.stores.db_timeout_seconds)
        checks["mongo"] = "ok"
    except Exception as exc:
        checks["mongo"] = f"down: {exc.__class__.__name__}"
    if isinstance(st.writer, RemoteWriter):
        ready = await st.writer.ready(st.settings.stores.db_timeout_seconds)
        checks["writer"] = "ok" if ready else "down: not answering"
    ok = all(v == "ok" for v in checks.values())
    return json_response({"status": "ok" if ok else "unavailable", "checks": checks}, 200 if ok else 503)


async def metrics_endpoint(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def openapi(request: Request) -> Response:
    return Response(request.app.state.openapi, media_type="application/json")


async def asyncapi(request: Request) -> Response:
    return Response(request.app.state.asyncapi, media_type="application/json")


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)  # registered for ApiError only; Starlette types every handler for Exception
    metrics.ERRORS.labels(exc.code).inc()
    return exc.response()


async def not_found(request: Request, exc: Exception) -> Response:
    return ApiError(404, "not_found", f"no route {request.url.path}").response()


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    # RFC 9110 wants the methods the resource takes in `Allow`. Starlette's own 405 names
    # only the first route that matched the path, and /v1/messages has two.
    allow = ", ".join(allowed_methods(request.app.routes, request.scope))
    return ApiError(405, "method_not_allowed", f"{request.method} is not allowed here",
                    headers={"Allow": allow}).response()


def allowed_methods(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """The methods the routes at the request's path take, sorted."""
    # The path as routing saw it: a Mount the request went through has moved root_path.
    probe = {"type": "http", "path": scope["path"], "method": scope["method"],
             "root_path": scope.get("app_root_path", scope.get("root_path", ""))}
    methods: set[str] = set()
    for route in routes:
        if route.matches(probe)[0] is Match.NONE:
            continue
        if isinstance(route, Route) and route.methods:
            methods |= route.methods
        elif isinstance(route, Mount) and isinstance(route.app, StaticFiles):
            methods |= {"GET", "HEAD"}  # all StaticFiles serves
    return sorted(methods)


POST_MESSAGE = PostMessage()

ROUTES = [
    Route("/v1/messages", POST_MESSAGE, methods=["POST"]),  # served by api.post_message.front
    Route("/v1/messages", get_history, methods=["GET"]),
    Route("/v1/messages/{id}", events.patch_message, methods=["PATCH"]),
    Route("/v1/messages/{id}", events.delete_message, methods=["DELETE"]),
    Route("/v1/acks", events.post_ack, methods=["POST"]),
    Route("/v1/devices", devices.register, methods=["POST"]),
    Route("/v1/devices", devices.list_devices, methods=["GET"]),
    Route("/v1/devices/{device}", devices.remove, methods=["DELETE"]),
    Route("/v1/read", events.post_read, methods=["POST"]),
    Route("/v1/conversations", get_conversations, methods=["GET"]),
    Route("/v1/typing", signals.post_typing, methods=["POST"]),
    Route("/v1/presence", signals.get_presence, methods=["GET"]),
    Route("/v1/presence/settings", signals.get_presence_settings, methods=["GET"]),
    Route("/v1/presence/settings", signals.put_presence_settings, methods=["PUT"]),
    Route("/v1/client-config", client_config, methods=["GET"]),
    Route("/v1/dev/token", dev_token, methods=["POST"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics_endpoint, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    Route("/asyncapi.json", asyncapi, methods=["GET"]),
]

# The reference web client (api/static/): not part of the JSON API, so not in OpenAPI.
PAGE_ROUTES = [
    Route("/", home, methods=["GET"]),
    Mount("/app", StaticFiles(directory=STATIC, html=True), name="app"),
]


def read_threads(engine: Engine) -> Threads:
    """A thread per connection the read engine may hold: more would only queue for one."""
    return Threads(pool_size_of(engine) + MAX_OVERFLOW, "reads")


def _writer(settings: Settings, db: AsyncDatabase, slot_map: SlotMap, on_stored: Callable[[], None],
            echoes_owed: Callable[[int], None]) -> tuple[PartitionedWriter | RemoteWriter, Engine | None]:
    """The host's writer process if there is one (writer/), else writers of this process's own, one per
    partition (writer/partitioned.py), as the writer process runs them; ``on_stored``: their wake of the
    FerretDB tails (``oplog.wake``); ``echoes_owed``: their wake of other hosts' echo watches (``writer.echo_wake``)."""
    if settings.writer.socket:
        # Its reply deadline is a last resort for a writer that hangs: the
        # writer's own MySQL and Mongo timeouts answer first.
        return RemoteWriter(settings.writer.socket, wait_seconds=settings.writer.wait_seconds,
                            reply_seconds=3 * settings.stores.db_timeout_seconds + settings.writer.wait_seconds), None
    # The writers' own connections: the reads cannot take them all from them.
    engine = make_engine(settings.stores.mysql_url.get_secret_value(), settings.stores.db_timeout_seconds,
                         pool_size=engine_pool_size(slot_map))
    return build(settings, engine, db, slot_map, on_stored, echoes_owed), engine


def create_app(settings: Settings) -> ASGIApp:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine = make_engine(settings.stores.mysql_url.get_secret_value(), settings.stores.db_timeout_seconds)
        client = mongo.make_client(settings.stores.mongo_url.get_secret_value(), settings.stores.db_timeout_seconds)
        db = client[settings.stores.mongo_db]
        slot_map = load_slot_map(engine)
        redis_url = settings.stores.redis_url.get_secret_value()
        signal_store = SignalStore(connect(redis_url, settings.stores.db_timeout_seconds)) if redis_url else None
        on_stored = WakePublisher.on_redis(signal_store.client).wake if signal_store is not None else lambda: None
        echo_wakes = EchoWakes.on_redis(signal_store.client) if signal_store is not None else None
        writer, writer_engine = _writer(settings, db, slot_map, on_stored,
                                        echo_wakes.owed if echo_wakes is not None else lambda partition: None)
        reads = read_threads(engine)
        # The slot map's look-up once a second, one round trip each (no ping, no rollback): an idle API
        # process's main cost otherwise.
        looks = make_engine(settings.stores.mysql_url.get_secret_value(), settings.stores.db_timeout_seconds,
                            pool_size=1, reads_only=True)
        # A move's cutover writes the map of the next epoch: this process reads by it
        # within a gap-check period (its own writers, at their next turn).
        maps = writer.live if isinstance(writer, PartitionedWriter) else LiveMap(slot_map)
        adopt = writer.adopt if isinstance(writer, PartitionedWriter) else maps.adopt
        limits = settings.api
        app.state.chat = State(settings, engine, client, writer,
                               RateLimiter(limits.rate_limit_per_second, limits.rate_limit_burst), reads,
                               maps, signal_store,
                               typing_limiter=RateLimiter(limits.rate_limit_per_second, limits.rate_limit_burst))
        tasks = [asyncio.create_task(run_sweeper(
                     db, engine, reads, settings.stores.retention_seconds, settings.stores.sweep_interval_seconds,
                     lambda: maps.current.partitions), name="sweeper"),
                 asyncio.create_task(watch_slot_map(looks, lambda: maps.current, adopt,
                                                    settings.daemon.gap_check_seconds), name="slot_map")]
        if isinstance(writer, PartitionedWriter):
            tasks.append(asyncio.create_task(writer.run(), name="writer"))
            if redis_url and settings.writer.led() is not None:
                tasks.append(asyncio.create_task(listen_for_echo_wakes(
                    redis_url, writer.echoes_woken, connect_seconds=settings.stores.db_timeout_seconds),
                    name="echo-wakes"))
        # What start-up made (modules, the app, the pools) lives as long as the
        # process: out of the cyclic GC's sight, so that its full passes walk
        # only what requests create (as in the daemon).
        gc.freeze()
        metrics.watch_gc()
        serve_metrics(settings.api.metrics_host, settings.api.metrics_port)
        log.info("event=api_started")
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            looks.dispose()
            await client.close()
            if isinstance(writer, PartitionedWriter):
                writer.close()
            else:
                await writer.close()
            if writer_engine is not None:  # the writer of this process's own
                writer_engine.dispose()
            reads.close()
            engine.dispose()
            if echo_wakes is not None:
                await bounded("echo_wake_publish", echo_wakes.settled(), settings.stores.db_timeout_seconds, log)
            if signal_store is not None:
                await signal_store.close()

    app = Starlette(routes=[*ROUTES, *PAGE_ROUTES], lifespan=lifespan,
                    exception_handlers={ApiError: api_error, 404: not_found, 405: method_not_allowed})
    # The document of this process's limits, serialised once.
    app.state.openapi = orjson.dumps(document(settings.api.body_max_chars, settings.api.request_max_bytes))
    app.state.asyncapi = orjson.dumps(asyncapi_document(settings))
    app.add_middleware(metrics.MetricsMiddleware)
    return front(app, POST_MESSAGE)
