"""The write API's routes for a conversation's events (docs/receipts.md):
delivery acks, read markers, edits and deletes. Each is a write through the
host's writer, like a message: the writer judges it against MySQL under its
partition's lock and answers with the row it wrote, or its refusal.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError, rate_limited, write_refused
from api.post_message import read_body
from api.state import State
from api.validation import (
    client_msg_id_of,
    parse_ack,
    parse_bearer,
    parse_edit,
    parse_read,
    stream_id,
)
from chat.drafts import Draft
from chat.messages import Kind, Message
from chat.write_errors import WRITE_FAILURES
from db.conversation_state import unread_by_peer


def _state(request: Request) -> State:
    return request.app.state.chat


def _user(request: Request, st: State) -> str:
    return parse_bearer(request.headers.get("authorization"), st.settings.auth.jwt_secret.get_secret_value())


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


async def _body(request: Request, st: State) -> bytes:
    async def receive():
        return await request.receive()
    return await read_body(receive, request.headers.get("content-length"), st.settings.api.request_max_bytes)


def _within_rate(st: State, user: str) -> None:
    wait = st.limiter.allow(user)
    if wait:
        raise rate_limited(wait)


async def submit(st: State, draft: Draft, field: str) -> tuple[Message, bool]:
    """The writer's answer to ``draft``, or its refusal as the error of ``docs/receipts.md``,
    ``field`` naming what the refusal is about (the app's handler counts it, as every ApiError)."""
    try:
        return await st.writer.submit(draft)
    except WRITE_FAILURES as exc:
        raise write_refused(exc, field) from None


async def post_ack(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    upto, device = parse_ack(await _body(request, st))
    _within_rate(st, user)
    msg, _created = await submit(st, Draft(user, device, "", None, Kind.ACK, upto), "upto")
    return _json({"device": device, "upto": str(msg.ref_id or 0)})


async def post_read(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    peer, upto = parse_read(await _body(request, st))
    _within_rate(st, user)
    msg, _created = await submit(st, Draft(user, peer, "", None, Kind.READ, upto), "upto")
    partition = st.slot_map.partition_of(user)
    unread = await st.read(lambda conn: unread_by_peer(conn, partition, user).get(peer, 0))
    return _json({"peer": peer, "upto": str(msg.ref_id or 0), "unread": unread})


async def patch_message(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    msg_id = stream_id(request.path_params["id"], "id")
    body, client_msg_id = parse_edit(await _body(request, st), st.settings.api.body_max_chars)
    _within_rate(st, user)
    msg, created = await submit(st, Draft(user, "", body, client_msg_id, Kind.EDIT, msg_id), "id")
    return _json(msg.to_public(), 201 if created else 200)


async def delete_message(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    msg_id = stream_id(request.path_params["id"], "id")
    unknown = sorted(set(request.query_params.keys()) - {"client_msg_id"})
    if unknown:
        raise ApiError(422, "invalid_field", f"unknown parameter `{unknown[0]}`", field=unknown[0])
    client_msg_id = client_msg_id_of(request.query_params.get("client_msg_id"))
    _within_rate(st, user)
    msg, created = await submit(st, Draft(user, "", "", client_msg_id, Kind.DELETE, msg_id), "id")
    return _json(msg.to_public(), 201 if created else 200)
