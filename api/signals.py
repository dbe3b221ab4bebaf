"""Typing and presence over HTTP (docs/presence.md): ``POST /v1/typing`` for
clients that long-poll, ``GET /v1/presence`` for a contact list, and each
user's choice to hide their presence (``/v1/presence/settings``).

Typing is published to Redis as a daemon publishes a WebSocket's; presence is
read from Redis (online) and MySQL (last seen, hidden). Nothing here is a
message: no writer, no id, no history.
"""

from __future__ import annotations

import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError, rate_limited
from api.events import _body, _json, _state, _user
from api.state import State
from api.validation import parse_presence_settings, parse_presence_users, parse_typing
from chat.signal_store import REDIS_ERRORS, SignalStore, typing_channel
from db import presence as presence_sql



def _signals(st: State) -> SignalStore:
    if st.signals is None:
        raise ApiError(503, "signals_unavailable", "this server has no Redis (CHAT_REDIS_URL)",
                       headers={"Retry-After": "1"})
    return st.signals


def _unavailable() -> ApiError:
    return ApiError(503, "signals_unavailable", "typing and presence are unavailable: Redis does not answer; retry",
                    headers={"Retry-After": "1"})


def _presence_on(st: State) -> None:
    if not st.settings.signals.presence_enabled:
        raise ApiError(404, "presence_disabled", "presence is turned off on this server")


async def post_typing(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    to, state = parse_typing(await _body(request, st))
    signals = _signals(st)
    if not st.typing_gate.passes((user, to), state, time.monotonic()):
        return _json({"sent": False}, 202)
    wait = st.typing_limiter.allow(user) if st.typing_limiter is not None else 0.0
    if wait:
        raise rate_limited(wait)
    partition_of = st.slot_map.partition_of
    channels = sorted({typing_channel(partition_of(to)), typing_channel(partition_of(user))})
    try:
        await signals.publish_typing(channels, "api/0", user, to, state)
    except REDIS_ERRORS:
        raise _unavailable() from None
    return _json({"sent": True}, 202)


async def get_presence(request: Request) -> Response:
    st = _state(request)
    _user(request, st)
    _presence_on(st)
    users = parse_presence_users(request.query_params)
    signals = _signals(st)
    rows = await st.read(lambda conn: presence_sql.rows_of(conn, users))
    try:
        online = await signals.online(users)
    except REDIS_ERRORS:
        raise _unavailable() from None
    return _json({"users": presence_sql.view(users, online, rows)})


async def get_presence_settings(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    _presence_on(st)
    hidden = await st.read(lambda conn: presence_sql.is_hidden(conn, user))
    return _json({"hidden": hidden})


async def put_presence_settings(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    _presence_on(st)
    hidden = parse_presence_settings(await _body(request, st))
    signals = _signals(st)
    # MySQL first: it is the truth a Redis that restarts reloads from.
    last_seen = await st.transaction(lambda conn: presence_sql.set_hidden(conn, user, hidden))
    try:
        await signals.set_hidden(user, hidden, last_seen)
    except REDIS_ERRORS:
        raise _unavailable() from None
    return Response(orjson.dumps({"hidden": hidden}), 200, media_type="application/json")
