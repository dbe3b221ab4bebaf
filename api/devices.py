"""Push devices (docs/push.md): a user registers the devices the pusher may
notify, lists them, and removes one. Stored in MySQL by the API itself: they
are not events of the stream, and the pusher reads them when it decides."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from sqlalchemy import select
from sqlalchemy.dialects.mysql import insert
from sqlalchemy.engine import Connection, Row
from starlette.requests import Request
from starlette.responses import Response

from api.errors import ApiError
from api.events import _body, _json, _state, _user
from api.validation import DEVICE_ID, DEVICE_RULE, parse_device
from db.sql import devices


def _public(row: Row) -> dict:
    return {"device": row.device, "platform": row.platform, "app_id": row.app_id, "pushkey": row.pushkey,
            "data": orjson.loads(row.data), "created_at": row.created_at.replace(tzinfo=UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z")}


async def register(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    device, platform, app_id, pushkey, data = parse_device(await _body(request, st))
    most = st.settings.push.devices_max

    def store(conn: Connection) -> tuple[bool, Row]:
        mine = conn.execute(select(devices.c.device).where(devices.c.user == user).with_for_update()).scalars().all()
        known = device in mine
        if not known and len(mine) >= most:
            raise ApiError(409, "too_many_devices", f"a user may register {most} devices (CHAT_PUSH_DEVICES_MAX); "
                           "remove one first", field="device")
        values = {"user": user, "device": device, "platform": platform, "app_id": app_id, "pushkey": pushkey,
                  "data": orjson.dumps(data).decode(), "created_at": datetime.now(UTC).replace(tzinfo=None)}
        statement = insert(devices).values(values)
        conn.execute(statement.on_duplicate_key_update(
            platform=statement.inserted.platform, app_id=statement.inserted.app_id,
            pushkey=statement.inserted.pushkey, data=statement.inserted.data))
        row = conn.execute(select(devices).where(devices.c.user == user, devices.c.device == device)).one()
        return known, row

    known, row = await st.transaction(store)
    return _json(_public(row), 200 if known else 201)


async def list_devices(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    rows = await st.read(lambda conn: conn.execute(
        select(devices).where(devices.c.user == user).order_by(devices.c.created_at, devices.c.device)).all())
    return _json({"devices": [_public(r) for r in rows]})


async def remove(request: Request) -> Response:
    st = _state(request)
    user = _user(request, st)
    device = request.path_params["device"]
    if not DEVICE_ID.fullmatch(device):
        raise ApiError(422, "invalid_field", DEVICE_RULE, field="device")

    def delete(conn: Connection) -> int:
        return conn.execute(devices.delete().where(devices.c.user == user, devices.c.device == device)).rowcount

    if not await st.transaction(delete):
        raise ApiError(404, "device_not_found", "no device of yours has this id", field="device")
    return Response(status_code=204)

