"""The OpenAPI document of the write API.

Its schemas are built from the rules ``api.validation`` applies (patterns,
ranges, field names) and from the settings' limits, not written out a second
time: a rule changed there changes the document with it. Each operation lists
every answer it can give, those of the HTTP layer (``chat.serve``) included.
tests/core/test_openapi.py holds the document to the validation,
tests/e2e/test_api_ops.py to the routes, and tests/e2e/test_api_schema.py
runs schemathesis against the API with it.
"""

from __future__ import annotations

import re

from api import validation as rules
from chat.serve import HEAD_MAX_BYTES
from chat.settings import Settings

_ERROR = {"$ref": "#/components/schemas/Error"}
_MESSAGE = {"$ref": "#/components/schemas/Message"}
_EDIT = {"$ref": "#/components/schemas/Edit"}
_DELETE = {"$ref": "#/components/schemas/Delete"}
_DEVICE = {"$ref": "#/components/schemas/Device"}
_RETRY_AFTER = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
_WWW_AUTHENTICATE = {"WWW-Authenticate": {"$ref": "#/components/headers/WWW-Authenticate"}}


def pattern(regex: re.Pattern[str]) -> str:
    """``regex``, which the API applies with fullmatch, as a JSON Schema pattern (a search: anchored here)."""
    return f"^(?:{regex.pattern})$"


def decimal_pattern(lo: int, hi: int, digits: int) -> str:
    """A JSON Schema pattern for the plain ASCII decimals from ``lo`` (0 or 1) to ``hi`` that are no longer
    than ``hi`` (leading zeros included), ``hi`` having ``digits`` digits: what ``chat.parsing.is_decimal``
    then a range check take, with ``maxLength`` = ``digits`` beside it."""
    top = str(hi)
    assert lo in (0, 1) and len(top) == digits
    # Fewer significant digits than ``hi``, after any zeros (maxLength bounds the whole).
    forms = [f"0*[1-9][0-9]{{0,{digits - 2}}}" + ("|0+" if lo == 0 else "")]
    # As many as ``hi``: equal to it up to a digit, then a smaller one, then any.
    for i, digit in enumerate(top):
        least = 1 if i == 0 else 0
        if int(digit) > least:
            forms.append(f"{top[:i]}[{least}-{int(digit) - 1}][0-9]{{{digits - 1 - i}}}")
    forms.append(top)
    return f"^(?:{'|'.join(forms)})$"


TYPING_STATES = ("start", "stop")


def user_list_pattern(regex: re.Pattern[str], most: int) -> str:
    """A JSON Schema pattern for 1 to ``most`` values of ``regex`` joined by commas, as
    ``api.validation.parse_presence_users`` reads them: no empty item, each counted (a repeat too)."""
    return f"^(?:{regex.pattern})(?:,(?:{regex.pattern})){{0,{most - 1}}}$"


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _err(description: str, *codes: str, headers: dict | None = None) -> dict:
    """An error answer: the JSON error shape, with ``error`` one of ``codes``."""
    schema = {"allOf": [_ERROR, {"properties": {"error": {"enum": list(codes)}}}]}
    answer = {"description": description, "content": _json(schema)}
    if headers:
        answer["headers"] = headers
    return answer


def _ok(description: str, schema: dict) -> dict:
    return {"description": description, "content": _json(schema)}


# Answered by the HTTP layer before any route, whatever the path (chat.serve).
_HEAD_ANSWERS = {
    "408": _err("Request head not complete CHAT_API_HEAD_TIMEOUT_SECONDS after its first byte; "
                "the connection is closed", "request_timeout"),
    "431": _err(f"Request head (request line and headers) over {HEAD_MAX_BYTES // 1024} KiB; the connection is "
                "closed", "headers_too_large"),
}


def document(body_max_chars: int, request_max_bytes: int) -> dict:
    """The document of an API that takes message bodies of ``body_max_chars`` characters and request bodies of
    ``request_max_bytes`` bytes (CHAT_BODY_MAX_CHARS, CHAT_REQUEST_MAX_BYTES)."""
    user_id = {"type": "string", "pattern": pattern(rules.USER_ID),
               "description": "A user id: 1-64 characters of [A-Za-z0-9_.-]"}
    too_large = _err(f"Request body over {request_max_bytes} bytes (CHAT_REQUEST_MAX_BYTES), "
                     "declared in Content-Length or sent; not read further", "body_too_large")
    malformed = _err("Malformed JSON: syntax, NaN, duplicate keys, invalid UTF-8, lone surrogates, "
                     f"nesting deeper than {rules.MAX_DEPTH}", "malformed_json")
    unauthorized = _err("Missing, forged, expired or alg:none token", "unauthorized", headers=_WWW_AUTHENTICATE)
    read_unavailable = _err("MySQL down or slow (mysql_unavailable), or the process at its connection limit "
                            "(overloaded)", "mysql_unavailable", "overloaded", headers=_RETRY_AFTER)
    overloaded = _err("The process is at its connection limit (CHAT_API_MAX_CONNECTIONS)", "overloaded",
                      headers=_RETRY_AFTER)
    write_unavailable = _err("MySQL down or slow, another writer holding the sender's partition's lock for the "
                             "whole lock wait (CHAT_DB_TIMEOUT_SECONDS), the writer queue full, the writer "
                             "process away past CHAT_WRITER_WAIT_SECONDS, or the process at its connection "
                             "limit: nothing stored (mysql_unavailable, partition_busy, overloaded, "
                             "writer_unavailable); or the COMMIT failed, or the writer process died holding the "
                             "request, and it may have been stored (outcome_unknown: retry with the same "
                             "client_msg_id)",
                             "mysql_unavailable", "partition_busy", "overloaded", "writer_unavailable",
                             "outcome_unknown", headers=_RETRY_AFTER)
    # The refusals of docs/receipts.md ("Errors"), by case.
    not_found = _err("`upto`, or the path's id, is not a message of the caller's stream (no such id, or an "
                     "event)", "message_not_found")
    deleted = "the message is deleted (message_deleted)"
    path_id = {"name": "id", "in": "path", "required": True,
               "description": "A message id of the caller's own stream, as GET /v1/messages and the pushed frames "
                              "give it", "schema": {"type": "integer", "minimum": rules.BEFORE_MIN,
                                                    "maximum": rules.BEFORE_MAX}}
    stream_id = {"anyOf": [
        {"type": "string", "maxLength": rules.NUMBER_DIGITS,
         "pattern": decimal_pattern(rules.BEFORE_MIN, rules.BEFORE_MAX, rules.NUMBER_DIGITS)},
        {"type": "integer", "minimum": rules.BEFORE_MIN, "maximum": rules.BEFORE_MAX}],
        "description": "An id of the caller's own stream: a decimal string, as a frame's `id`, or a JSON integer"}
    rate_limited = _err("Sender over its rate limit (CHAT_RATE_LIMIT_PER_SECOND)", "rate_limited",
                        headers=_RETRY_AFTER)
    client_msg_id = {"type": ["string", "null"], "pattern": pattern(rules.CLIENT_MSG_ID),
                     "description": "1-64 characters of [A-Za-z0-9_.:-]: a retry with the same one stores "
                                    "nothing new"}
    bad_shape = _err("Valid JSON of the wrong shape; `field` names the field", "invalid_field", "invalid_body")
    device_id = {"type": "string", "pattern": pattern(rules.DEVICE_ID),
                 "description": "A device id: 1-64 characters of [A-Za-z0-9_.-]"}
    devices_max = Settings.field("push.devices_max").default
    past = ("past the newest id of the caller's stream (past_newest); else valid JSON of the wrong shape, `field` "
            "naming the field")
    redis_away = "Redis, which carries the signals, does not answer or is not configured (signals_unavailable)"
    presence_disabled = _err("Presence is off on this server (CHAT_PRESENCE_ENABLED=false)", "presence_disabled")
    return {
        "openapi": "3.1.0",
        "info": {"title": "chat-delivery write API", "version": "1"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "bearerFormat": "JWT (HS256, sub, exp)"}},
            "headers": {
                "Retry-After": {"description": "Seconds to wait before retrying", "required": True,
                                "schema": {"type": "integer", "minimum": 1}},
                "WWW-Authenticate": {"description": "The scheme to authenticate with", "required": True,
                                     "schema": {"type": "string", "const": "Bearer"}},
            },
            "schemas": {
                "NewMessage": {
                    "type": "object", "additionalProperties": False, "required": ["to", "body"],
                    "properties": {
                        "to": user_id,
                        "body": {"type": "string", "minLength": 1, "maxLength": body_max_chars,
                                 "description": f"1 to {body_max_chars} characters (CHAT_BODY_MAX_CHARS); the "
                                                "whole request body also within CHAT_REQUEST_MAX_BYTES"},
                        "client_msg_id": client_msg_id,
                    },
                },
                "Message": {
                    "type": "object",
                    "description": "Its latest version: `edited_at` once edited; once deleted, `deleted: true` "
                                   "and an empty `body` (a tombstone that keeps its id)",
                    "required": ["type", "id", "from", "to", "body", "created_at", "client_msg_id"],
                    "properties": {
                        "type": {"const": "message"},
                        "id": {"type": "string", "description": "Opaque; also a valid `since` for the daemons"},
                        "from": user_id, "to": user_id, "body": {"type": "string"},
                        "created_at": {"type": "string", "format": "date-time"},
                        "client_msg_id": {"type": ["string", "null"]},
                        "edited_at": {"type": "string", "format": "date-time",
                                      "description": "When its body was last replaced; absent if it never was"},
                        "deleted": {"const": True, "description": "Present once deleted"},
                    },
                },
                "NewBody": {
                    "type": "object", "additionalProperties": False, "required": ["body"],
                    "properties": {
                        "body": {"type": "string", "minLength": 1, "maxLength": body_max_chars,
                                 "description": f"The new body: 1 to {body_max_chars} characters "
                                                "(CHAT_BODY_MAX_CHARS)"},
                        "client_msg_id": client_msg_id,
                    },
                },
                "Edit": {
                    "type": "object", "description": "The `edit` event, as the daemons push it",
                    "required": ["type", "id", "from", "to", "ref", "body", "created_at", "client_msg_id"],
                    "properties": {
                        "type": {"const": "edit"},
                        "id": {"type": "string", "description": "The event's id in the caller's stream"},
                        "from": user_id, "to": user_id,
                        "ref": {"type": "string", "description": "The message edited"},
                        "body": {"type": "string"},
                        "created_at": {"type": "string", "format": "date-time"},
                        "client_msg_id": {"type": ["string", "null"]},
                    },
                },
                "Delete": {
                    "type": "object", "description": "The `delete` event, as the daemons push it",
                    "required": ["type", "id", "from", "to", "ref", "created_at", "client_msg_id"],
                    "properties": {
                        "type": {"const": "delete"},
                        "id": {"type": "string", "description": "The event's id in the caller's stream"},
                        "from": user_id, "to": user_id,
                        "ref": {"type": "string", "description": "The message deleted"},
                        "created_at": {"type": "string", "format": "date-time"},
                        "client_msg_id": {"type": ["string", "null"]},
                    },
                },
                "Ack": {
                    "type": "object", "additionalProperties": False, "required": ["upto"],
                    "properties": {
                        "upto": {**stream_id, "description": "This device has received the caller's stream up to "
                                                             "here (any id up to its newest, a message's or an "
                                                             "event's)"},
                        "device": {"type": ["string", "null"], "pattern": pattern(rules.DEVICE_ID),
                                   "description": f"1-64 characters of [A-Za-z0-9_.-]; `{rules.DEFAULT_DEVICE}` if "
                                                  "not given (or null)"},
                    },
                },
                "AckAnswer": {
                    "type": "object", "required": ["device", "upto"],
                    "properties": {"device": {"type": "string"},
                                   "upto": {"type": "string", "description": "The device's acknowledged position "
                                                                             "(an older ack does not lower it)"}},
                },
                "ReadMarker": {
                    "type": "object", "additionalProperties": False, "required": ["peer", "upto"],
                    "properties": {
                        "peer": user_id,
                        "upto": {**stream_id, "description": "A message between the caller and `peer`: read up "
                                                             "to and including it"},
                    },
                },
                "ReadAnswer": {
                    "type": "object", "required": ["peer", "upto", "unread"],
                    "properties": {
                        "peer": user_id,
                        "upto": {"type": "string", "description": "The caller's marker now (an older one "
                                                                  "changes nothing)"},
                        "unread": {"type": "integer", "minimum": 0,
                                   "description": "The caller's unread messages in the conversation with `peer`"},
                    },
                },
                "History": {
                    "type": "object", "required": ["messages", "next_before"],
                    "properties": {
                        "messages": {"type": "array", "maxItems": rules.HISTORY_LIMIT_MAX, "items": _MESSAGE},
                        "next_before": {"type": ["string", "null"],
                                        "description": "Pass as `before` for the next page"},
                    },
                },
                "Conversations": {
                    "type": "object", "required": ["conversations"],
                    "properties": {"conversations": {"type": "array", "maxItems": 50, "items": {
                        "type": "object",
                        "required": ["with", "last", "unread", "read_upto", "peer_read_upto", "peer_delivered_upto"],
                        "properties": {
                            "with": {**user_id, "description": "The peer"}, "last": _MESSAGE,
                            "unread": {"type": "integer", "minimum": 0, "description": "Messages from the peer "
                                       "above the caller's read marker, not deleted"},
                            "read_upto": {"type": ["string", "null"], "description": "The caller's read marker "
                                          "(an id of a message from the peer), or null"},
                            "peer_read_upto": {"type": ["string", "null"], "description": "The peer's read marker, "
                                               "as the id of one of the caller's messages, or null"},
                            "peer_delivered_upto": {"type": ["string", "null"], "description": "The newest of the "
                                                    "caller's messages a device of the peer has received, or "
                                                    "null"},
                        },
                    }}},
                },
                "ClientConfig": {
                    "type": "object", "required": ["ws_url", "poll_url", "dev_login"],
                    "properties": {
                        "ws_url": {"type": "string", "description": "The daemons' /v1/ws (CHAT_PUBLIC_DAEMON_URL)"},
                        "poll_url": {"type": "string", "description": "The daemons' /v1/poll"},
                        "dev_login": {"type": "boolean", "description": "Whether POST /v1/dev/token answers"},
                        "partition": {"type": "integer", "minimum": 0, "description":
                                      "The caller's partition (only with a token): the page adds ?partition= to "
                                      "/v1/ws and /v1/poll"},
                    },
                },
                "Readiness": {
                    "type": "object", "required": ["status", "checks"],
                    "properties": {"status": {"enum": ["ok", "unavailable"]},
                                   "checks": {"type": "object", "additionalProperties": {"type": "string"},
                                              "description": "ok, or down: and why, per dependency"}},
                },
                "NewDevice": {
                    "type": "object", "additionalProperties": False,
                    "required": ["device", "platform", "app_id", "pushkey"],
                    "properties": {
                        "device": {**device_id, "description": "The caller's name for the device: 1-64 characters "
                                                               "of [A-Za-z0-9_.-]; registering it again replaces it"},
                        "platform": {"type": "string", "pattern": pattern(rules.PLATFORM),
                                     "description": "1-16 characters of [a-z0-9_-]: ios, android, web"},
                        "app_id": {"type": "string", "pattern": pattern(rules.APP_ID),
                                   "description": "The app id the push gateway knows: 1-128 characters of "
                                                  "[A-Za-z0-9._-]"},
                        "pushkey": {"type": "string", "pattern": pattern(rules.PUSHKEY),
                                    "description": "The device's push token: 1-512 printable ASCII characters "
                                                   "(an APNs token, an FCM token, a Web Push endpoint)"},
                        "data": {"type": ["object", "null"],
                                 "description": f"Passed to the push gateway with each notification; at most "
                                                f"{rules.DEVICE_DATA_MAX_BYTES} bytes as JSON; `{{}}` if not given "
                                                "(or null)"},
                    },
                },
                "Device": {
                    "type": "object", "required": ["device", "platform", "app_id", "pushkey", "data", "created_at"],
                    "properties": {
                        "device": device_id, "platform": {"type": "string"}, "app_id": {"type": "string"},
                        "pushkey": {"type": "string"}, "data": {"type": "object"},
                        "created_at": {"type": "string", "format": "date-time",
                                       "description": "When the device was first registered (a replacement "
                                                      "keeps it)"},
                    },
                },
                "Devices": {
                    "type": "object", "required": ["devices"],
                    "properties": {"devices": {"type": "array", "items": _DEVICE, "description":
                                               f"Oldest registration first; at most CHAT_PUSH_DEVICES_MAX "
                                               f"({devices_max} by default)"}},
                },
                "TypingNotice": {
                    "type": "object", "additionalProperties": False, "required": ["to"],
                    "properties": {
                        "to": {**user_id, "description": "The peer the caller is typing to"},
                        "state": {"enum": list(TYPING_STATES), "default": "start",
                                  "description": "`start` (again about every 2-3 s while typing) or `stop`"},
                    },
                },
                "TypingAnswer": {
                    "type": "object", "required": ["sent"],
                    "properties": {"sent": {"type": "boolean", "description": "false: a `start` within a second "
                                                                              "of the caller's last one to this "
                                                                              "peer, dropped"}},
                },
                "Presence": {
                    "type": "object", "required": ["users"],
                    "properties": {"users": {"type": "array", "maxItems": rules.PRESENCE_USERS_MAX, "items": {
                        "type": "object", "required": ["user", "online", "last_seen"],
                        "properties": {
                            "user": user_id,
                            "online": {"type": "boolean", "description": "At least one live WebSocket or waiting "
                                                                         "long-poll, on any daemon of any host"},
                            "last_seen": {"type": ["string", "null"], "format": "date-time",
                                          "description": "When the user's last connection ended; null while "
                                                         "online, for a user never seen, and for a hidden one"},
                        },
                    }}},
                },
                "PresenceSettings": {
                    "type": "object", "additionalProperties": False, "required": ["hidden"],
                    "properties": {"hidden": {"type": "boolean", "description": "true: the caller reads as "
                                                                                "offline and never seen, to "
                                                                                "everyone"}},
                },
                "Error": {
                    "type": "object", "required": ["error", "message"],
                    "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                                   "field": {"type": "string", "description": "The field or parameter at fault"}},
                },
            },
        },
        "paths": {
            "/v1/messages": {
                "post": {
                    "summary": "Send a one-to-one message as the token's user",
                    "security": [{"bearer": []}],
                    "requestBody": {"required": True, "content": _json({"$ref": "#/components/schemas/NewMessage"})},
                    "responses": {
                        "201": _ok("Stored (MySQL committed; Mongo written or queued in the outbox)", _MESSAGE),
                        "200": _ok("A retry: the original message for this (sender, client_msg_id); "
                                   "nothing new stored", _MESSAGE),
                        "400": malformed,
                        "401": unauthorized,
                        "409": _err("client_msg_id reused by this sender for a different message",
                                    "client_msg_id_conflict"),
                        "413": too_large,
                        "422": bad_shape,
                        "429": rate_limited,
                        "503": write_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
                "get": {
                    "summary": "Conversation history with one peer, newest first; any other parameter is a 422",
                    "security": [{"bearer": []}],
                    "parameters": [
                        {"name": "with", "in": "query", "required": True, "schema": user_id},
                        {"name": "before", "in": "query", "description": "A message id: `next_before` of the "
                         "previous page", "schema": {"type": "integer", "minimum": rules.BEFORE_MIN,
                                                     "maximum": rules.BEFORE_MAX}},
                        {"name": "limit", "in": "query", "description": "Messages per page", "schema": {
                            "type": "integer", "minimum": rules.HISTORY_LIMIT_MIN,
                            "maximum": rules.HISTORY_LIMIT_MAX, "default": rules.HISTORY_LIMIT_DEFAULT}},
                    ],
                    "responses": {
                        "200": _ok("A page", {"$ref": "#/components/schemas/History"}),
                        "401": unauthorized,
                        "422": _err("A parameter missing, out of range or unknown; `field` names it",
                                    "invalid_field"),
                        "503": read_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/messages/{id}": {
                "patch": {
                    "summary": "Edit one of the caller's messages: replace its body. Both users' devices get the "
                               "`edit` event; the message reads with its new body and `edited_at` after",
                    "security": [{"bearer": []}],
                    "parameters": [path_id],
                    "requestBody": {"required": True, "content": _json({"$ref": "#/components/schemas/NewBody"})},
                    "responses": {
                        "201": _ok("Stored: the `edit` event", _EDIT),
                        "200": _ok("A retry: the edit stored for this (sender, client_msg_id); nothing new "
                                   "stored", _EDIT),
                        "400": malformed,
                        "401": unauthorized,
                        "403": _err("The message is not the caller's", "not_sender"),
                        "404": not_found,
                        "409": _err(f"The edit window (CHAT_EDIT_WINDOW_SECONDS) is closed (edit_window_closed), "
                                    f"{deleted}, or client_msg_id reused by this sender for something else "
                                    "(client_msg_id_conflict)",
                                    "message_deleted", "edit_window_closed", "client_msg_id_conflict"),
                        "413": too_large,
                        "422": _err("Valid JSON of the wrong shape, or the path's id not a message id; `field` "
                                    "names it", "invalid_field", "invalid_body"),
                        "429": rate_limited,
                        "503": write_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
                "delete": {
                    "summary": "Delete one of the caller's messages. Both users' devices get the `delete` event; "
                               "the message reads as a tombstone after (`deleted: true`, empty `body`)",
                    "security": [{"bearer": []}],
                    "parameters": [path_id, {"name": "client_msg_id", "in": "query", "required": False,
                                    "description": "1-64 characters of [A-Za-z0-9_.:-]: a retry with the same one "
                                                   "stores nothing new",
                                    "schema": {"type": "string", "pattern": pattern(rules.CLIENT_MSG_ID)}}],
                    "responses": {
                        "201": _ok("Stored: the `delete` event", _DELETE),
                        "200": _ok("A retry: the delete stored for this (sender, client_msg_id); nothing new "
                                   "stored", _DELETE),
                        "401": unauthorized,
                        "403": _err("The message is not the caller's", "not_sender"),
                        "404": not_found,
                        "409": _err(f"The edit window (CHAT_EDIT_WINDOW_SECONDS) is closed (edit_window_closed), "
                                    f"{deleted}, or client_msg_id reused by this sender for something else "
                                    "(client_msg_id_conflict)",
                                    "message_deleted", "edit_window_closed", "client_msg_id_conflict"),
                        "422": _err("`client_msg_id` malformed, the path's id not a message id, or a parameter "
                                    "unknown; `field` names it", "invalid_field"),
                        "429": rate_limited,
                        "503": write_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/acks": {
                "post": {
                    "summary": "A device of the caller has received its stream up to `upto`: the peers of the "
                               "conversations it covers get a `delivered` event. For clients that do not hold "
                               "a WebSocket (which sends `ack` frames instead)",
                    "security": [{"bearer": []}],
                    "requestBody": {"required": True, "content": _json({"$ref": "#/components/schemas/Ack"})},
                    "responses": {
                        "200": _ok("Recorded, or older than the device's position (which stays)",
                                   {"$ref": "#/components/schemas/AckAnswer"}),
                        "400": malformed,
                        "401": unauthorized,
                        "413": too_large,
                        "422": _err(f"`upto` {past}", "invalid_field", "invalid_body", "past_newest"),
                        "429": rate_limited,
                        "503": write_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/devices": {
                "post": {
                    "summary": "Register a device of the caller for offline push (the pusher notifies it through "
                               "the push gateway), or replace the registration of the same `device`",
                    "security": [{"bearer": []}],
                    "requestBody": {"required": True, "content": _json({"$ref": "#/components/schemas/NewDevice"})},
                    "responses": {
                        "201": _ok("Registered", _DEVICE),
                        "200": _ok("Replaced: the caller had registered this `device`; its `created_at` stays",
                                   _DEVICE),
                        "400": malformed,
                        "401": unauthorized,
                        "409": _err(f"The caller has CHAT_PUSH_DEVICES_MAX ({devices_max} by default) devices "
                                    "registered, none of them this one: remove one first", "too_many_devices"),
                        "413": too_large,
                        "422": bad_shape,
                        "503": _err("MySQL down or slow (mysql_unavailable; the registration may have been stored: "
                                    "repeating it is safe), or the process at its connection limit (overloaded)",
                                    "mysql_unavailable", "overloaded", headers=_RETRY_AFTER),
                        **_HEAD_ANSWERS,
                    },
                },
                "get": {
                    "summary": "The caller's registered push devices",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": _ok("The list", {"$ref": "#/components/schemas/Devices"}),
                        "401": unauthorized,
                        "503": read_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/devices/{device}": {
                "delete": {
                    "summary": "Remove one of the caller's push devices: the pusher notifies it no more",
                    "security": [{"bearer": []}],
                    "parameters": [{"name": "device", "in": "path", "required": True, "schema": device_id,
                                    "description": "The `device` it was registered with"}],
                    "responses": {
                        "204": {"description": "Removed"},
                        "401": unauthorized,
                        "404": _err("The caller has no device of this id (device_not_found); or a `/` in it, "
                                    "even as %2F, which makes the path another one, of no route (not_found)",
                                    "device_not_found", "not_found"),
                        "422": _err("The path's device is not a device id; `field` names it", "invalid_field"),
                        "503": _err("MySQL down or slow (mysql_unavailable; the device may have been removed: "
                                    "repeating it answers 404), or the process at its connection limit "
                                    "(overloaded)", "mysql_unavailable", "overloaded", headers=_RETRY_AFTER),
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/read": {
                "post": {
                    "summary": "The caller has read the conversation with `peer` up to message `upto`: both users' "
                               "devices get a `read` event",
                    "security": [{"bearer": []}],
                    "requestBody": {"required": True,
                                    "content": _json({"$ref": "#/components/schemas/ReadMarker"})},
                    "responses": {
                        "200": _ok("The caller's marker now, and the conversation's unread count; an older marker "
                                   "changes nothing (the same answer)", {"$ref": "#/components/schemas/ReadAnswer"}),
                        "400": malformed,
                        "401": unauthorized,
                        "403": _err("`upto` is not a message between the caller and `peer`", "not_in_conversation"),
                        "404": not_found,
                        "409": _err(f"`upto`: {deleted}", "message_deleted"),
                        "413": too_large,
                        "422": _err(f"`upto` {past}", "invalid_field", "invalid_body", "past_newest"),
                        "429": rate_limited,
                        "503": write_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/typing": {
                "post": {
                    "summary": "The caller is typing to `to`, or stopped: `to`'s live connections and the caller's "
                               "get a `typing` frame (docs/presence.md). For clients that do not hold a WebSocket "
                               "(which send `typing` frames instead); a waiting long-poll gets it in `signals`",
                    "security": [{"bearer": []}],
                    "requestBody": {"required": True, "content": _json({"$ref": "#/components/schemas/TypingNotice"})},
                    "responses": {
                        "202": _ok("Sent, or dropped as a refresh within a second of the last (`sent: false`)",
                                   {"$ref": "#/components/schemas/TypingAnswer"}),
                        "400": malformed,
                        "401": unauthorized,
                        "413": too_large,
                        "422": bad_shape,
                        "429": rate_limited,
                        "503": _err(f"{redis_away}, or the process at its connection limit (overloaded)",
                                    "signals_unavailable", "overloaded", headers=_RETRY_AFTER),
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/presence": {
                "get": {
                    "summary": "Whether each of `users` is online, and when those who are not were last seen "
                               "(docs/presence.md); a hidden user reads as offline and never seen",
                    "security": [{"bearer": []}],
                    "parameters": [{"name": "users", "in": "query", "required": True,
                                    "description": f"1 to {rules.PRESENCE_USERS_MAX} user ids, by commas (a repeat "
                                                   "counts once; empty items are skipped)",
                                    "schema": {"type": "string",
                                               "pattern": user_list_pattern(rules.USER_ID, rules.PRESENCE_USERS_MAX)}}],
                    "responses": {
                        "200": _ok("Each user asked about once, in the order asked",
                                   {"$ref": "#/components/schemas/Presence"}),
                        "401": unauthorized,
                        "404": presence_disabled,
                        "422": _err(f"`users` missing, empty, over {rules.PRESENCE_USERS_MAX}, or with one that is "
                                    "not a user id; `field` names it", "invalid_field"),
                        "503": _err(f"{redis_away}, MySQL down or slow (mysql_unavailable), or the process at its "
                                    "connection limit (overloaded)", "signals_unavailable", "mysql_unavailable",
                                    "overloaded", headers=_RETRY_AFTER),
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/presence/settings": {
                "get": {
                    "summary": "Whether the caller hides their presence",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": _ok("The caller's setting", {"$ref": "#/components/schemas/PresenceSettings"}),
                        "401": unauthorized,
                        "404": presence_disabled,
                        "503": read_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
                "put": {
                    "summary": "Hide the caller's presence (`hidden: true`: offline and never seen to everyone; "
                               "their watchers see them go offline), or show it again",
                    "security": [{"bearer": []}],
                    "requestBody": {"required": True,
                                    "content": _json({"$ref": "#/components/schemas/PresenceSettings"})},
                    "responses": {
                        "200": _ok("The caller's setting now", {"$ref": "#/components/schemas/PresenceSettings"}),
                        "400": malformed,
                        "401": unauthorized,
                        "404": presence_disabled,
                        "413": too_large,
                        "422": bad_shape,
                        "503": _err("MySQL down or slow (mysql_unavailable: nothing changed), Redis away "
                                    "(signals_unavailable: stored, the watchers not told yet; repeating it is safe), "
                                    "or the process at its connection limit (overloaded)",
                                    "mysql_unavailable", "signals_unavailable", "overloaded", headers=_RETRY_AFTER),
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/conversations": {
                "get": {
                    "summary": "The caller's conversations, newest first (at most 50), each with its last "
                               "message, its unread count and its read and delivery markers",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": _ok("The list", {"$ref": "#/components/schemas/Conversations"}),
                        "401": unauthorized,
                        "503": read_unavailable,
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/client-config": {
                "get": {
                    "summary": "Where the web client finds the daemons, whether dev login is on, and (with a "
                               "token) the caller's partition",
                    "security": [{}, {"bearer": []}],
                    "responses": {
                        "200": _ok("The config", {"$ref": "#/components/schemas/ClientConfig"}),
                        "401": _err("A token was sent and is invalid or expired", "unauthorized",
                                    headers=_WWW_AUTHENTICATE),
                        "503": overloaded,
                        **_HEAD_ANSWERS,
                    },
                },
            },
            "/v1/dev/token": {
                "post": {
                    "summary": "Development only (CHAT_DEV_LOGIN with CHAT_DEV_MODE): a token for any user, "
                               "no password",
                    "requestBody": {"required": True, "content": _json({
                        "type": "object", "additionalProperties": False, "required": list(rules.DEV_LOGIN_FIELDS),
                        "properties": {"user": user_id}})},
                    "responses": {
                        "200": _ok("A token valid for 12 h", {
                            "type": "object", "required": ["token", "user"],
                            "properties": {"token": {"type": "string"}, "user": user_id}}),
                        "400": malformed,
                        "404": _err("Dev login is off (always in production)", "not_found"),
                        "413": too_large,
                        "422": _err("Valid JSON of the wrong shape (`user` not a user id, another field); "
                                    "`field` names it", "invalid_field", "invalid_body"),
                        "503": overloaded,
                        **_HEAD_ANSWERS,
                    },
                },
            },
            # The probes are served at the connection limit too: no 503 overloaded on them.
            "/healthz": {"get": {"summary": "The process is alive", "responses": {
                "200": _ok("ok", {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}),
                **_HEAD_ANSWERS,
            }}},
            "/readyz": {"get": {"summary": "Both databases answer, and the writer process where there is one",
                                "responses": {
                                    "200": _ok("ready", {"$ref": "#/components/schemas/Readiness"}),
                                    "503": _ok("a database, or the writer process, does not answer",
                                               {"$ref": "#/components/schemas/Readiness"}),
                                    **_HEAD_ANSWERS,
                                }}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
                "200": {"description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}}},
                **_HEAD_ANSWERS,
            }}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {
                "200": _ok("OpenAPI 3.1", {"type": "object"}),
                "503": overloaded,
                **_HEAD_ANSWERS,
            }}},
            "/asyncapi.json": {"get": {"summary": "The AsyncAPI 3.0 document of the daemons' /v1/ws and /v1/poll: "
                                                  "every frame, the close codes", "responses": {
                "200": _ok("AsyncAPI 3.0", {"type": "object"}),
                "503": overloaded,
                **_HEAD_ANSWERS,
            }}},
        },
    }


# The document under the default settings: what tools and tests read without a running API.
OPENAPI = document(Settings.field("api.body_max_chars").default, Settings.field("api.request_max_bytes").default)
