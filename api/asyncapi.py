"""The AsyncAPI 3.0 document of the push side: the daemons' ``/v1/ws`` and ``/v1/poll``.

OpenAPI describes the write API; this describes every frame a daemon sends
and every frame it accepts, and the close codes, so that a client can be
generated from it or checked against it. The close codes come from
``chat.errors.CloseCode`` and the limits from the settings, not written out a
second time. tests/core/test_asyncapi.py validates the document with the
AsyncAPI project's own parser and holds its schemas to the frames the daemon
builds; the end-to-end tests check every frame they receive against it.
"""

from __future__ import annotations

from chat.errors import CloseCode
from chat.settings import Settings

# What each close code tells the client to do: the contract of README's
# "Daemons" section, by code.
CLOSE_MEANINGS: dict[CloseCode, str] = {
    CloseCode.NORMAL: "The client's own close answered (its code is echoed; an empty close gets 1000).",
    CloseCode.PROTOCOL_ERROR: "Protocol error: an unmasked frame, reserved bits or opcodes, a bad control frame, "
                              "a continuation with nothing to continue, a new message inside a fragmented one, "
                              "an invalid close code.",
    CloseCode.INVALID_DATA: "Text, or a close reason, that is not UTF-8.",
    CloseCode.POLICY: "Too many inbound frames (CHAT_WS_MAX_FRAMES_PER_SECOND).",
    CloseCode.TOO_BIG: "An inbound frame over CHAT_WS_MAX_FRAME_BYTES.",
    CloseCode.SERVER_ERROR: "Server error: reconnect with `since`.",
    CloseCode.RESTART: "The daemon is restarting: reconnect with `since`.",
    CloseCode.TRY_AGAIN: "This daemon has not reached your `since`, or messages expired during a long "
                         "catch-up: reconnect with `since`.",
    CloseCode.TOKEN_EXPIRED: "The token's `exp` passed: reconnect with a new token and `since`.",
    CloseCode.SLOW_CONSUMER: "The client fell CHAT_SEND_BUFFER_MAX_BYTES of unsent frames behind: reconnect "
                             "with `since`.",
    CloseCode.UNAUTHORIZED: "No valid `auth` frame within CHAT_WS_AUTH_SECONDS.",
    CloseCode.WRONG_PARTITION: 'The user is served by another partition; the reason is {"partition": k}: '
                               "reconnect with `?partition=k`.",
}

_ID = {"type": "string", "pattern": r"^[0-9]+$", "description": "The message's id in its partition, decimal."}
_CURSOR = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+\.[0-9]+)?$",
           "description": "A resume point: pass it back as `since`. `position`, or `partition.epoch.position` "
                          "with more than one partition."}
_USER = {"type": "string", "minLength": 1}


def _message_schema(body_max_chars: int) -> dict:
    return {
        "type": "object",
        "required": ["type", "id", "from", "to", "body", "created_at", "client_msg_id"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "message"},
            "id": _ID,
            "from": _USER,
            "to": _USER,
            "body": {"type": "string", "maxLength": body_max_chars},
            "created_at": {"type": "string", "format": "date-time",
                           "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$",
                           "description": "UTC, millisecond precision."},
            "client_msg_id": {"type": ["string", "null"],
                              "description": "The sender's idempotency key, if it gave one."},
            "cursor": {**_CURSOR, "description": "Present with more than one partition: resume with the last one."},
        },
    }


def schemas(settings: Settings) -> dict[str, dict]:
    """The JSON Schemas (AsyncAPI's schema format, a superset of draft 7) of every frame, by name."""
    message = _message_schema(settings.body_max_chars)
    return {
        "Hello": {
            "type": "object",
            "required": ["type", "recovered", "cursor", "user"],
            "additionalProperties": False,
            "properties": {
                "type": {"const": "hello"},
                "recovered": {"type": "boolean",
                              "description": "false: there was no `since`, or it was unknown or older than "
                                             "retention; reload history from GET /v1/messages."},
                "cursor": _CURSOR,
                "user": _USER,
            },
        },
        "Message": message,
        "Auth": {
            "type": "object",
            "required": ["type", "token"],
            "properties": {"type": {"const": "auth"}, "token": {"type": "string", "minLength": 1}},
            "description": "The first frame from a browser, which cannot set Authorization, within "
                           "CHAT_WS_AUTH_SECONDS.",
        },
        "PollAnswer": {
            "type": "object",
            "required": ["messages", "cursor", "recovered"],
            "additionalProperties": False,
            "properties": {
                "messages": {"type": "array", "items": message, "maxItems": settings.poll_max_messages},
                "cursor": _CURSOR,
                "recovered": {"type": "boolean"},
            },
        },
        "Error": {
            "type": "object",
            "required": ["error", "message"],
            "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                           "partition": {"type": "integer", "minimum": 0}},
            "description": "An HTTP answer other than 200 (the handshake's or the poll's): 401, 403, 421, 422, "
                           "431, 503, 505.",
        },
    }


def document(settings: Settings) -> dict:
    found = schemas(settings)
    messages = {name: {"name": name, "contentType": "application/json",
                       "payload": {"$ref": f"#/components/schemas/{name}"}} for name in found}
    close_codes = [{"code": int(code), "name": code.name.lower(), "meaning": CLOSE_MEANINGS[code]}
                   for code in CloseCode]
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "chat-delivery: the daemons' push",
            "version": "1",
            "description": "Every message addressed to or sent by a user, pushed to each of the user's "
                           "connections once, in order, resumable with `since`.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "daemons": {"host": f"localhost:{settings.daemon_port}", "protocol": "ws",
                        "description": "Every daemon process of a host, on one shared port."},
        },
        "channels": {
            "ws": {
                "address": "/v1/ws",
                "description": "A WebSocket. Authorization: Bearer <jwt>, or an `auth` frame first.",
                "messages": {"hello": {"$ref": "#/components/messages/Hello"},
                             "message": {"$ref": "#/components/messages/Message"},
                             "auth": {"$ref": "#/components/messages/Auth"}},
                "bindings": {"ws": {"method": "GET", "query": {
                    "type": "object",
                    "properties": {"since": {"type": "string", "description": "A message id or a cursor."},
                                   "partition": {"type": "string", "pattern": r"^[0-9]+$"}}}}},
                "x-close-codes": close_codes,
            },
            "poll": {
                "address": "/v1/poll",
                "description": "The long-poll twin: GET with Authorization: Bearer <jwt>; answers as soon as "
                               "messages exist, or empty at the timeout.",
                "messages": {"answer": {"$ref": "#/components/messages/PollAnswer"},
                             "error": {"$ref": "#/components/messages/Error"}},
                "x-query": {"since": "a message id or a cursor",
                            "timeout": f"0..{settings.poll_max_timeout_seconds:g} s",
                            "limit": f"1..{settings.poll_max_messages}"},
            },
        },
        "operations": {
            "sendHello": {"action": "send", "channel": {"$ref": "#/channels/ws"},
                          "summary": "First frame on every connection.",
                          "messages": [{"$ref": "#/channels/ws/messages/hello"}]},
            "sendMessage": {"action": "send", "channel": {"$ref": "#/channels/ws"},
                            "summary": "One text frame per message, catch-up first, then live.",
                            "messages": [{"$ref": "#/channels/ws/messages/message"}]},
            "receiveAuth": {"action": "receive", "channel": {"$ref": "#/channels/ws"},
                            "summary": "The token, from a client that cannot send headers.",
                            "messages": [{"$ref": "#/channels/ws/messages/auth"}]},
            "answerPoll": {"action": "send", "channel": {"$ref": "#/channels/poll"},
                           "summary": "The messages after `since`, the next cursor, or an error.",
                           "messages": [{"$ref": "#/channels/poll/messages/answer"},
                                        {"$ref": "#/channels/poll/messages/error"}]},
        },
        "components": {"schemas": found, "messages": messages},
    }
