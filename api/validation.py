"""Request bodies -> typed values, or an ApiError that names the field. Pure.

400: the bytes are not one sound JSON document (syntax, NaN, duplicate keys,
     invalid UTF-8, lone surrogates, nesting deeper than MAX_DEPTH).
422: sound JSON of the wrong shape (unknown or missing field, wrong type,
     out-of-range value, operator objects like {"$ne": ""} where a string belongs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import orjson

from api.errors import ApiError
from chat import auth
from chat.auth import is_user_id
from chat.drafts import Draft
from chat import parsing
from chat.parsing import is_decimal

# The rules below are also what /openapi.json states (api.openapi builds its
# schemas from these names), so a change here changes the document with it.
MAX_DEPTH = 16
USER_ID = auth.USER_ID  # 1-64 chars of [A-Za-z0-9_.-]: the same rule as a token's `sub`
CLIENT_MSG_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MESSAGE_FIELDS = ("to", "body", "client_msg_id")
EDIT_FIELDS = ("body", "client_msg_id")
ACK_FIELDS = ("upto", "device")
READ_FIELDS = ("peer", "upto")
TYPING_FIELDS = ("to", "state")
PRESENCE_SETTINGS_FIELDS = ("hidden",)
PRESENCE_USERS_MAX = 200  # users one GET /v1/presence reads
DEVICE_ID = parsing.DEVICE_ID
DEVICE_RULE = "`device` must be 1-64 chars of [A-Za-z0-9_.-], not . or .."
DEFAULT_DEVICE = "default"
DEV_LOGIN_FIELDS = ("user",)
# GET /v1/messages: its query parameters, and the ranges of the two numbers.
HISTORY_PARAMS = ("with", "before", "limit")
HISTORY_LIMIT_MIN, HISTORY_LIMIT_MAX, HISTORY_LIMIT_DEFAULT = 1, 200, 50
BEFORE_MIN, BEFORE_MAX = 1, 2**63 - 1  # a message id: MySQL's BIGINT
NUMBER_DIGITS = len(str(BEFORE_MAX))  # 19: a longer decimal is out of range (leading zeros aside)


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ApiError(400, "malformed_json", f"duplicate key {key!r}", field=key)
            seen.add(key)
    return obj


# One decoder for every request: json.loads(raw, object_pairs_hook=...) built a
# new JSONDecoder per call.
_DUPLICATE_KEYS = json.JSONDecoder(object_pairs_hook=_reject_duplicates)


def _depth(value: object, limit: int) -> int:
    stack = [(value, 1)]
    deepest = 0
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_json(raw: bytes) -> object:
    # orjson is strict where the stdlib is lenient: it rejects NaN/Infinity,
    # invalid UTF-8 and lone surrogates, and caps nesting. It keeps the last of
    # duplicate keys silently, so a second, stdlib pass catches those.
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "malformed_json", f"request body is not valid JSON: {exc}") from None
    if _depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise ApiError(400, "malformed_json", f"JSON nested deeper than {MAX_DEPTH} levels")
    _DUPLICATE_KEYS.decode(raw.decode())  # valid UTF-8: orjson said so
    return value


def _string(obj: dict, name: str, *, required: bool) -> str | None:
    if name not in obj or (obj[name] is None and not required):
        if required:
            raise ApiError(422, "invalid_field", f"`{name}` is required", field=name)
        return None
    value = obj[name]
    if not isinstance(value, str):
        raise ApiError(422, "invalid_field", f"`{name}` must be a string, got {type(value).__name__}", field=name)
    return value


def parse_bearer(header: str | None, secret: str) -> str:
    """The user an ``Authorization: Bearer <jwt>`` header speaks for, or 401."""
    try:
        return auth.verify(secret, auth.bearer(header))
    except auth.AuthError as exc:
        raise ApiError(401, "unauthorized", str(exc), headers={"WWW-Authenticate": "Bearer"}) from None


def parse_message(raw: bytes, sender: str, body_max_chars: int) -> Draft:
    obj = parse_json(raw)
    if not isinstance(obj, dict):
        raise ApiError(422, "invalid_body", "request body must be a JSON object")
    unknown = sorted(set(obj) - set(MESSAGE_FIELDS))
    if unknown:
        raise ApiError(422, "invalid_field", f"unknown field `{unknown[0]}`; allowed: to, body, client_msg_id",
                       field=unknown[0])
    to = _string(obj, "to", required=True)
    if not is_user_id(to):
        raise ApiError(422, "invalid_field", "`to` must be a user id: 1-64 chars of [A-Za-z0-9_.-]", field="to")
    body = _string(obj, "body", required=True)
    if not body:
        raise ApiError(422, "invalid_field", "`body` must not be empty", field="body")
    if len(body) > body_max_chars:
        raise ApiError(422, "invalid_field", f"`body` is longer than {body_max_chars} characters", field="body")
    client_msg_id = _string(obj, "client_msg_id", required=False)
    if client_msg_id is not None and not CLIENT_MSG_ID.fullmatch(client_msg_id):
        raise ApiError(422, "invalid_field", "`client_msg_id` must be 1-64 chars of [A-Za-z0-9_.:-]",
                       field="client_msg_id")
    return Draft(sender=sender, recipient=to, body=body, client_msg_id=client_msg_id)


def parse_dev_login(raw: bytes) -> str:
    """``{"user": id}`` -> the user id (POST /v1/dev/token)."""
    obj = parse_json(raw)
    if not isinstance(obj, dict):
        raise ApiError(422, "invalid_body", "request body must be a JSON object")
    unknown = sorted(set(obj) - set(DEV_LOGIN_FIELDS))
    if unknown:
        raise ApiError(422, "invalid_field", f"unknown field `{unknown[0]}`; allowed: user", field=unknown[0])
    user = _string(obj, "user", required=True)
    if not is_user_id(user):
        raise ApiError(422, "invalid_field", "`user` must be a user id: 1-64 chars of [A-Za-z0-9_.-]", field="user")
    return user


def parse_history_query(params: Mapping[str, str],
                        max_limit: int = HISTORY_LIMIT_MAX) -> tuple[str, int | None, int]:
    unknown = sorted(set(params.keys()) - set(HISTORY_PARAMS))
    if unknown:
        raise ApiError(422, "invalid_field", f"unknown parameter `{unknown[0]}`", field=unknown[0])
    peer = params.get("with")
    if not is_user_id(peer):
        raise ApiError(422, "invalid_field", "`with` must be a user id: 1-64 chars of [A-Za-z0-9_.-]", field="with")
    before = _int_param(params, "before", BEFORE_MIN, BEFORE_MAX)
    limit = _int_param(params, "limit", HISTORY_LIMIT_MIN, max_limit)
    return peer, before, limit if limit is not None else HISTORY_LIMIT_DEFAULT


def _int_param(params: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if not is_decimal(value, NUMBER_DIGITS) or not lo <= int(value) <= hi:
        raise ApiError(422, "invalid_field", f"`{name}` must be an integer from {lo} to {hi}", field=name)
    return int(value)


def _object(raw: bytes, fields: tuple[str, ...]) -> dict:
    obj = parse_json(raw)
    if not isinstance(obj, dict):
        raise ApiError(422, "invalid_body", "request body must be a JSON object")
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise ApiError(422, "invalid_field", f"unknown field `{unknown[0]}`; allowed: {', '.join(fields)}",
                       field=unknown[0])
    return obj


def stream_id(value: object, name: str) -> int:
    """A message id of the caller's stream, as frames write it (a decimal string) or as a JSON integer."""
    if type(value) is int and BEFORE_MIN <= value <= BEFORE_MAX:
        return value
    if isinstance(value, str) and is_decimal(value, NUMBER_DIGITS) and BEFORE_MIN <= int(value) <= BEFORE_MAX:
        return int(value)
    raise ApiError(422, "invalid_field", f"`{name}` must be a message id: a decimal string from {BEFORE_MIN} "
                   f"to {BEFORE_MAX}", field=name)


def parse_ack(raw: bytes) -> tuple[int, str]:
    """``{"upto": id, "device": name}`` (POST /v1/acks) -> (upto, device)."""
    obj = _object(raw, ACK_FIELDS)
    if "upto" not in obj:
        raise ApiError(422, "invalid_field", "`upto` is required", field="upto")
    upto = stream_id(obj["upto"], "upto")
    device = _string(obj, "device", required=False)
    if device is None:
        device = DEFAULT_DEVICE
    elif not DEVICE_ID.fullmatch(device):
        raise ApiError(422, "invalid_field", DEVICE_RULE, field="device")
    return upto, device


def parse_read(raw: bytes) -> tuple[str, int]:
    """``{"peer": user, "upto": id}`` (POST /v1/read) -> (peer, upto)."""
    obj = _object(raw, READ_FIELDS)
    peer = _string(obj, "peer", required=True)
    if not is_user_id(peer):
        raise ApiError(422, "invalid_field", "`peer` must be a user id: 1-64 chars of [A-Za-z0-9_.-]", field="peer")
    if "upto" not in obj:
        raise ApiError(422, "invalid_field", "`upto` is required", field="upto")
    return peer, stream_id(obj["upto"], "upto")


def parse_edit(raw: bytes, body_max_chars: int) -> tuple[str, str | None]:
    """``{"body": text, "client_msg_id": key}`` (PATCH /v1/messages/{id}) -> (body, client_msg_id)."""
    obj = _object(raw, EDIT_FIELDS)
    body = _string(obj, "body", required=True)
    if not body:
        raise ApiError(422, "invalid_field", "`body` must not be empty", field="body")
    if len(body) > body_max_chars:
        raise ApiError(422, "invalid_field", f"`body` is longer than {body_max_chars} characters", field="body")
    return body, client_msg_id_of(_string(obj, "client_msg_id", required=False))


def client_msg_id_of(value: str | None) -> str | None:
    if value is not None and not CLIENT_MSG_ID.fullmatch(value):
        raise ApiError(422, "invalid_field", "`client_msg_id` must be 1-64 chars of [A-Za-z0-9_.:-]",
                       field="client_msg_id")
    return value


DEVICE_FIELDS = ("device", "platform", "app_id", "pushkey", "data")
PLATFORM = re.compile(r"[a-z0-9_-]{1,16}")
APP_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
PUSHKEY = re.compile(r"[\x21-\x7e]{1,512}")  # printable ASCII: APNs tokens (hex), FCM tokens, Web Push URLs
DEVICE_DATA_MAX_BYTES = 1024


def parse_device(raw: bytes) -> tuple[str, str, str, str, dict]:
    """``{"device", "platform", "app_id", "pushkey", "data"?}`` (POST /v1/devices)."""
    obj = _object(raw, DEVICE_FIELDS)
    device = _string(obj, "device", required=True)
    if not DEVICE_ID.fullmatch(device or ""):
        raise ApiError(422, "invalid_field", DEVICE_RULE, field="device")
    platform = _string(obj, "platform", required=True)
    if not PLATFORM.fullmatch(platform or ""):
        raise ApiError(422, "invalid_field", "`platform` must be 1-16 chars of [a-z0-9_-] (ios, android, web)",
                       field="platform")
    app_id = _string(obj, "app_id", required=True)
    if not APP_ID.fullmatch(app_id or ""):
        raise ApiError(422, "invalid_field", "`app_id` must be 1-128 chars of [A-Za-z0-9._-]", field="app_id")
    pushkey = _string(obj, "pushkey", required=True)
    if not PUSHKEY.fullmatch(pushkey or ""):
        raise ApiError(422, "invalid_field", "`pushkey` must be 1-512 printable ASCII characters", field="pushkey")
    data = obj.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_field", "`data` must be a JSON object", field="data")
    if len(orjson.dumps(data)) > DEVICE_DATA_MAX_BYTES:
        raise ApiError(422, "invalid_field", f"`data` is over {DEVICE_DATA_MAX_BYTES} bytes as JSON", field="data")
    return device or "", platform or "", app_id or "", pushkey or "", data


def parse_typing(raw: bytes) -> tuple[str, str]:
    """``{"to": user, "state": "start"|"stop"}`` (POST /v1/typing) -> (to, state)."""
    obj = _object(raw, TYPING_FIELDS)
    to = _string(obj, "to", required=True)
    if not is_user_id(to):
        raise ApiError(422, "invalid_field", "`to` must be a user id: 1-64 chars of [A-Za-z0-9_.-]", field="to")
    state = obj.get("state", "start")
    if state not in ("start", "stop"):
        raise ApiError(422, "invalid_field", "`state` must be start or stop", field="state")
    return to, state


def parse_presence_users(params: Mapping[str, str]) -> list[str]:
    """``?users=a,b,c`` (GET /v1/presence): 1 to 200 user ids, duplicates dropped, order kept."""
    unknown = sorted(set(params.keys()) - {"users"})
    if unknown:
        raise ApiError(422, "invalid_field", f"unknown parameter `{unknown[0]}`", field=unknown[0])
    raw = params.get("users", "")
    if not raw:
        raise ApiError(422, "invalid_field", "`users` is required: comma-separated user ids", field="users")
    listed = raw.split(",")
    if len(listed) > PRESENCE_USERS_MAX:
        raise ApiError(422, "invalid_field", f"at most {PRESENCE_USERS_MAX} users at once", field="users")
    if not all(is_user_id(u) for u in listed):
        raise ApiError(422, "invalid_field", "`users` must be user ids: 1-64 chars of [A-Za-z0-9_.-]",
                       field="users")
    return list(dict.fromkeys(listed))


def parse_presence_settings(raw: bytes) -> bool:
    """``{"hidden": true|false}`` (PUT /v1/presence/settings) -> hidden."""
    obj = _object(raw, PRESENCE_SETTINGS_FIELDS)
    hidden = obj.get("hidden")
    if type(hidden) is not bool:
        raise ApiError(422, "invalid_field", "`hidden` must be true or false", field="hidden")
    return hidden
