"""The AsyncAPI 3.0 document of the push side: the daemons' ``/v1/ws`` and ``/v1/poll``.

OpenAPI describes the write API; this describes every frame a daemon sends
(messages, and the events of docs/receipts.md: edits, deletes, read markers,
delivery receipts; the signals of docs/presence.md: typing and presence) and
every frame it accepts (``auth``, ``ack``, ``read``, ``typing``, ``watch``),
and the close codes, so that a client can be
generated from it or checked against it. The close codes come from
``chat.errors.CloseCode`` and the limits from the settings, not written out a
second time. tests/core/test_asyncapi.py validates the document with the
AsyncAPI project's own parser and holds its schemas to the frames the daemon
builds; the end-to-end tests check every frame they receive against it.
"""

from __future__ import annotations

from api.openapi import decimal_pattern, pattern
from chat.auth import USER_ID
from chat.errors import CloseCode
from chat.settings import Settings

# What each close code tells the client to do: the contract of README's
# "Daemons" section, by code.
CLOSE_MEANINGS: dict[CloseCode, str] = {
    CloseCode.NORMAL: "The client's own close answered (its code is echoed; an empty close gets 1000).",
    CloseCode.PROTOCOL_ERROR: "Protocol error: an unmasked frame, reserved bits or opcodes, a bad control frame, "
                              "a continuation with nothing to continue, a new message inside a fragmented one, "
                              "an invalid close code.",
    CloseCode.INVALID_DATA: "Text, or a close reason, that is not UTF-8; or a client frame of a documented `type` "
                            "(`auth`, `ack`, `read`, `typing`, `watch`) without its fields of the right types, or "
                            "with others: the reason says what is wrong.",
    CloseCode.POLICY: "Too many inbound frames (CHAT_WS_MAX_FRAMES_PER_SECOND).",
    CloseCode.TOO_BIG: "An inbound frame over CHAT_WS_MAX_FRAME_BYTES.",
    CloseCode.SERVER_ERROR: "Server error: reconnect with `since`.",
    CloseCode.RESTART: "The daemon is restarting: reconnect with `since`.",
    CloseCode.TRY_AGAIN: "This daemon has not reached your `since`, the stores did not answer your catch-up in "
                         "time, or messages expired during a long catch-up: reconnect with `since`.",
    CloseCode.TOKEN_EXPIRED: "The token's `exp` passed: reconnect with a new token and `since`.",
    CloseCode.SLOW_CONSUMER: "The client fell CHAT_SEND_BUFFER_MAX_BYTES of unsent frames behind: reconnect "
                             "with `since`.",
    CloseCode.UNAUTHORIZED: "No valid `auth` frame within CHAT_WS_AUTH_SECONDS.",
    CloseCode.WRONG_PARTITION: 'The user is served by another partition; the reason is {"partition": k}: '
                               "reconnect with `?partition=k`.",
}

_ID = {"type": "string", "pattern": r"^[0-9]+$",
       "description": "Its position in the receiving user's partition's stream, decimal."}
_REF = {"type": "string", "pattern": r"^[0-9]+$",
        "description": "The id of a message in the receiving device's own stream (the same message has a "
                       "different id in each partition: each device is told the one it knows)."}
_CURSOR = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+\.[0-9]+)?$",
           "description": "A resume point: pass it back as `since`. `position`, or `partition.epoch.position` "
                          "with more than one partition."}
_FRAME_CURSOR = {**_CURSOR, "description": "Present with more than one partition: resume with the last one."}
_USER = {"type": "string", "minLength": 1}
_CREATED_AT = {"type": "string", "format": "date-time", "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$",
               "description": "UTC, millisecond precision."}
_CLIENT_MSG_ID = {"type": ["string", "null"], "description": "The sender's idempotency key, if it gave one."}
_UNREAD = {"type": ["integer", "null"], "minimum": 0,
           "description": "The user's unread messages over every conversation (from a peer, above the user's "
                          "read marker, not deleted); null when MySQL could not be read in time."}
# The handshake's `device` (the device an `ack` counts for): the rule of a user id.
DEVICE = pattern(USER_ID)
DEFAULT_DEVICE = "default"
# What a client frame's `upto` may be: a decimal string of a message id's range (MySQL's BIGINT), at most 19
# digits, as the API's ids.
ID_MAX, ID_DIGITS = 2**63 - 1, 19
_UPTO = {"type": "string", "maxLength": ID_DIGITS, "pattern": decimal_pattern(1, ID_MAX, ID_DIGITS)}
# The codes of an `error` frame: a refused `ack` or `read` (docs/receipts.md, "Errors"), a refused `typing` or
# `watch`, or a frame of a `type` the daemon does not know (docs/presence.md, "What the client may send wrong").
ERROR_FRAME_CODES = ("message_not_found", "not_in_conversation", "past_newest", "message_deleted",
                     "writer_unavailable", "watch_too_many", "unknown_type", "signals_unavailable",
                     "presence_disabled", "server_error")
# The client frames an `error` frame may name besides an unknown type's, which it names as it came.
REFUSED_FRAMES = ("ack", "read", "typing", "watch")
TYPING_STATES = ("start", "stop")
_LAST_SEEN = {**_CREATED_AT, "type": ["string", "null"],
              "description": "When the user's last connection ended (UTC, millisecond precision); null while "
                             "online, for a user never seen, and for a hidden one."}


def _frame(kind: str, description: str, fields: dict[str, dict], optional: dict[str, dict] | None = None) -> dict:
    """The schema of a server frame of ``type`` ``kind``: ``fields`` required, ``optional`` and ``cursor`` not."""
    return {
        "type": "object",
        "description": description,
        "required": ["type", *fields],
        "additionalProperties": False,
        "properties": {"type": {"const": kind}, **fields, **(optional or {}), "cursor": _FRAME_CURSOR},
    }


def _message_schema(body_max_chars: int) -> dict:
    schema = _frame(
        "message",
        "A message. A catch-up, a poll and GET /v1/messages give its latest version: `edited_at` once edited; "
        "once deleted, `deleted: true` and an empty `body` (a tombstone that keeps its id).",
        {"id": _ID, "from": _USER, "to": _USER, "body": {"type": "string", "maxLength": body_max_chars},
         "created_at": _CREATED_AT, "client_msg_id": _CLIENT_MSG_ID},
        {"edited_at": {**_CREATED_AT, "description": "When its body was last replaced (UTC, millisecond "
                                                     "precision); absent if it never was."},
         "deleted": {"const": True, "description": "Present once deleted."}})
    # A tombstone drops its body.
    return {**schema, "if": {"required": ["deleted"]}, "then": {"properties": {"body": {"maxLength": 0}}}}


def _event_schemas(body_max_chars: int) -> dict[str, dict]:
    """The events of docs/receipts.md: rows of the stream, pushed in order with the messages, to the actor's
    other devices and to the peer's."""
    base: dict[str, dict] = {"id": _ID, "from": _USER, "to": _USER}
    upto = {**_REF, "description": f"{_REF['description']} Everything up to and including it."}
    return {
        "Edit": _frame("edit", "`from` replaced the body of their message `ref` with `body`.",
                       {**base, "ref": _REF, "body": {"type": "string", "maxLength": body_max_chars},
                        "created_at": _CREATED_AT, "client_msg_id": _CLIENT_MSG_ID}),
        "Delete": _frame("delete", "`from` deleted their message `ref`.",
                         {**base, "ref": _REF, "created_at": _CREATED_AT, "client_msg_id": _CLIENT_MSG_ID}),
        "Read": _frame("read", "`from` has read every message `to` sent them up to and including `upto` (a "
                               "message from `to` to `from`).",
                       {**base, "upto": upto, "created_at": _CREATED_AT}),
        "Delivered": _frame("delivered", "A device of `from` has received every message `to` sent them up to "
                                         "and including `upto`.",
                            {**base, "upto": upto, "created_at": _CREATED_AT}),
    }


def _signal(kind: str, description: str, fields: dict[str, dict]) -> dict:
    """The schema of a signal a daemon sends (docs/presence.md): every field required, no id and no cursor (a
    signal has no place in the stream: it is never resumed, never in a catch-up)."""
    return {"type": "object", "description": description, "required": ["type", *fields],
            "additionalProperties": False, "properties": {"type": {"const": kind}, **fields}}


def _signal_schemas(settings: Settings) -> dict[str, dict]:
    """Typing and presence, as daemons send them (docs/presence.md)."""
    online = {"type": "boolean", "description": "At least one live WebSocket or waiting long-poll, anywhere."}
    user_presence: dict[str, dict] = {"user": _USER, "online": online, "last_seen": _LAST_SEEN}
    online_has_no_last_seen: dict[str, dict] = {
        "if": {"properties": {"online": {"const": True}}, "required": ["online"]},
        "then": {"properties": {"last_seen": {"type": "null"}}}}
    entry: dict[str, object] = {"type": "object", "required": list(user_presence), "additionalProperties": False,
                                "properties": user_presence, **online_has_no_last_seen}
    return {
        "Typing": _signal("typing", "`from` is typing to `to` (`start`): show it for `ttl` seconds unless another "
                                    "`start` refreshes it; or stopped (`stop`): hide it at once. Sent to `to`'s "
                                    "live connections and to `from`'s other ones.",
                          {"from": _USER, "to": _USER, "state": {"enum": list(TYPING_STATES)},
                           "ttl": {"type": "number", "exclusiveMinimum": 0,
                                   "description": "Seconds a `start` shows for (CHAT_TYPING_TTL_SECONDS)."}}),
        "PresenceSnapshot": _signal("presence", "The answer to a `watch`: each watched user's presence now.",
                                    {"users": {"type": "array", "items": entry,
                                               "maxItems": settings.signals.presence_watch_max}}),
        "PresenceChange": {**_signal("presence", "A watched user came online, or went offline (after "
                                                 "CHAT_PRESENCE_GRACE_SECONDS with no connection, or on hiding).",
                                     user_presence), **online_has_no_last_seen},
    }


def schemas(settings: Settings) -> dict[str, dict]:
    """The JSON Schemas (AsyncAPI's schema format, a superset of draft 7) of every frame, by name."""
    message = _message_schema(settings.api.body_max_chars)
    events = _event_schemas(settings.api.body_max_chars)
    signals = _signal_schemas(settings)
    return {
        "Hello": {
            "type": "object",
            "required": ["type", "recovered", "cursor", "user", "unread"],
            "additionalProperties": False,
            "properties": {
                "type": {"const": "hello"},
                "recovered": {"type": "boolean",
                              "description": "false: there was no `since`, or it was unknown or older than "
                                             "retention; reload history from GET /v1/messages."},
                "cursor": _CURSOR,
                "user": _USER,
                "unread": _UNREAD,
            },
        },
        "Message": message,
        **events,
        **signals,
        "ErrorFrame": {
            "type": "object",
            "required": ["type", "code", "message", "frame"],
            "additionalProperties": False,
            "properties": {
                "type": {"const": "error"},
                "code": {"enum": list(ERROR_FRAME_CODES)},
                "message": {"type": "string"},
                "frame": {"type": "string", "description": "The `type` of the client frame refused."},
            },
            # `unknown_type` names the type as the client sent it; every other code, a frame the daemon takes.
            "if": {"properties": {"code": {"not": {"const": "unknown_type"}}}},
            "then": {"properties": {"frame": {"enum": list(REFUSED_FRAMES)}}},
            "description": "A refused `ack` or `read` (docs/receipts.md, \"Errors\"), a refused `typing` or "
                           "`watch` (`watch_too_many`: the list is unchanged; `signals_unavailable`: Redis is "
                           "away or not configured; `presence_disabled`: a `watch` where "
                           "CHAT_PRESENCE_ENABLED=false), a JSON object of a `type` the daemon does not know "
                           "(`unknown_type`), or a frame the daemon failed on (`server_error`: send it again); "
                           "the socket stays open. Success has no answer: a `read` arrives on "
                           "the stream, as on the user's other devices; a `watch` is answered by a presence "
                           "snapshot.",
        },
        "Auth": {
            "type": "object",
            "required": ["type", "token"],
            "properties": {"type": {"const": "auth"}, "token": {"type": "string", "minLength": 1}},
            "description": "The first frame from a browser, which cannot set Authorization, within "
                           "CHAT_WS_AUTH_SECONDS.",
        },
        "Ack": {
            "type": "object",
            "required": ["type", "upto"],
            "additionalProperties": False,
            "properties": {"type": {"const": "ack"},
                           "upto": {**_UPTO, "description": "This device has received the stream up to here."}},
            "description": "After the hello: this connection's device (the handshake's `device`) has received "
                           "the stream up to `upto`. Newer acks replace one still waiting; no answer but a "
                           "refusal (`error`).",
        },
        "ReadMarker": {
            "type": "object",
            "required": ["type", "peer", "upto"],
            "additionalProperties": False,
            "properties": {"type": {"const": "read"}, "peer": {"type": "string", "pattern": pattern(USER_ID)},
                           "upto": {**_UPTO, "description": "A message of the conversation with `peer`."}},
            "description": "After the hello: the user has read the conversation with `peer` up to message "
                           "`upto`. A newer marker for the same peer replaces one still waiting; no answer but "
                           "the `read` event on the stream, or a refusal (`error`).",
        },
        "TypingNotice": {
            "type": "object",
            "required": ["type", "to"],
            "additionalProperties": False,
            "properties": {"type": {"const": "typing"},
                           "to": {"type": "string", "pattern": pattern(USER_ID), "description": "The peer."},
                           "state": {"enum": list(TYPING_STATES), "default": "start"}},
            "description": "The user is typing to `to` (`start`; send it again about every 2-3 s while typing) "
                           "or stopped (`stop`). A second `start` to the same peer within a second of the last "
                           "is dropped; a `stop` always passes. No answer but a refusal (`error`).",
        },
        "Watch": {
            "type": "object",
            "required": ["type", "users"],
            "additionalProperties": False,
            "properties": {"type": {"const": "watch"},
                           "users": {"type": "array", "items": {"type": "string", "pattern": pattern(USER_ID)},
                                     "maxItems": settings.signals.presence_watch_max,
                                     "description": "Replaces the connection's list; `[]` clears it. Over "
                                                    "CHAT_PRESENCE_WATCH_MAX users: an `error` "
                                                    "`watch_too_many`, and the list stays as it was."}},
            "description": "The users whose presence this connection follows: answered by a snapshot, then a "
                           "change frame as each of them comes or goes.",
        },
        "PollAnswer": {
            "type": "object",
            "required": ["messages", "cursor", "recovered", "unread", "signals"],
            "additionalProperties": False,
            "properties": {
                "messages": {"type": "array", "items": {"oneOf": [message, *events.values()]},
                             "maxItems": settings.daemon.poll_max_messages,
                             "description": "Messages and events, in stream order."},
                "signals": {"type": "array", "items": signals["Typing"],
                            "description": "The typing events that came while the poll waited (a poll that is "
                                           "not waiting misses them, as a closed socket does)."},
                "cursor": _CURSOR,
                "recovered": {"type": "boolean"},
                "unread": _UNREAD,
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


# The channel message of each frame a daemon sends on /v1/ws, and of each it accepts.
_WS_SENT = {"hello": "Hello", "message": "Message", "edit": "Edit", "delete": "Delete", "read": "Read",
            "delivered": "Delivered", "error": "ErrorFrame", "typing": "Typing",
            "presenceSnapshot": "PresenceSnapshot", "presenceChange": "PresenceChange"}
_WS_RECEIVED = {"auth": "Auth", "ack": "Ack", "readMarker": "ReadMarker", "typingNotice": "TypingNotice",
                "watch": "Watch"}


def document(settings: Settings) -> dict:
    found = schemas(settings)
    messages = {name: {"name": name, "contentType": "application/json",
                       "payload": {"$ref": f"#/components/schemas/{name}"}} for name in found}
    close_codes = [{"code": int(code), "name": code.name.lower(), "meaning": CLOSE_MEANINGS[code]}
                   for code in CloseCode]

    def ws(*keys: str) -> list[dict]:
        return [{"$ref": f"#/channels/ws/messages/{key}"} for key in keys]

    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "chat-delivery: the daemons' push",
            "version": "1",
            "description": "Every message addressed to or sent by a user, and every event of the user's "
                           "conversations (edits, deletes, read markers, delivery receipts: rows of the same "
                           "stream), pushed to each of the user's connections once, in order, resumable with "
                           "`since`; and the signals (typing, and the presence of the users a connection "
                           "watches), live only: never stored, never resumed.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "daemons": {"host": f"localhost:{settings.daemon.port}", "protocol": "ws",
                        "description": "Every daemon process of a host, on one shared port."},
        },
        "channels": {
            "ws": {
                "address": "/v1/ws",
                "description": "A WebSocket. Authorization: Bearer <jwt>, or an `auth` frame first. After the "
                               "hello the client may send `ack`, `read`, `typing` and `watch` frames; one of these "
                               "with a field missing, extra or of the wrong type is closed with 1007; a JSON "
                               "object of another `type` gets an `error` frame (`unknown_type`); other data is "
                               "checked (framing, UTF-8, rate) and dropped.",
                "messages": {key: {"$ref": f"#/components/messages/{name}"}
                             for key, name in {**_WS_SENT, **_WS_RECEIVED}.items()},
                "bindings": {"ws": {"method": "GET", "query": {
                    "type": "object",
                    "properties": {"since": {"type": "string", "description": "A message id or a cursor."},
                                   "partition": {"type": "string", "pattern": r"^[0-9]+$"},
                                   "device": {"type": "string", "pattern": DEVICE, "default": DEFAULT_DEVICE,
                                              "description": "The device this connection's `ack`s count for."}}}}},
                "x-close-codes": close_codes,
            },
            "poll": {
                "address": "/v1/poll",
                "description": "The long-poll twin: GET with Authorization: Bearer <jwt>; answers as soon as "
                               "messages or events exist, or empty at the timeout.",
                "messages": {"answer": {"$ref": "#/components/messages/PollAnswer"},
                             "error": {"$ref": "#/components/messages/Error"}},
                "x-query": {"since": "a message id or a cursor",
                            "timeout": f"0..{settings.daemon.poll_max_timeout_seconds:g} s",
                            "limit": f"1..{settings.daemon.poll_max_messages}"},
            },
        },
        "operations": {
            "sendHello": {"action": "send", "channel": {"$ref": "#/channels/ws"},
                          "summary": "First frame on every connection.",
                          "messages": ws("hello")},
            "sendMessage": {"action": "send", "channel": {"$ref": "#/channels/ws"},
                            "summary": "One text frame per message, catch-up first, then live.",
                            "messages": ws("message")},
            "sendEvent": {"action": "send", "channel": {"$ref": "#/channels/ws"},
                          "summary": "One text frame per event, in stream order with the messages, caught up "
                                     "and deduplicated as they are.",
                          "messages": ws("edit", "delete", "read", "delivered")},
            "sendError": {"action": "send", "channel": {"$ref": "#/channels/ws"},
                          "summary": "A refused `ack`, `read`, `typing` or `watch`, or a frame of an unknown "
                                     "`type`; the socket stays open.",
                          "messages": ws("error")},
            "sendTyping": {"action": "send", "channel": {"$ref": "#/channels/ws"},
                           "summary": "Someone is typing to the user, or the user is on another connection: live "
                                      "connections only, never in a catch-up.",
                           "messages": ws("typing")},
            "sendPresence": {"action": "send", "channel": {"$ref": "#/channels/ws"},
                             "summary": "The presence of the users this connection watches: a snapshot after each "
                                        "`watch`, then each change.",
                             "messages": ws("presenceSnapshot", "presenceChange")},
            "receiveAuth": {"action": "receive", "channel": {"$ref": "#/channels/ws"},
                            "summary": "The token, from a client that cannot send headers.",
                            "messages": ws("auth")},
            "receiveAck": {"action": "receive", "channel": {"$ref": "#/channels/ws"},
                           "summary": "What this connection's device has received.",
                           "messages": ws("ack")},
            "receiveRead": {"action": "receive", "channel": {"$ref": "#/channels/ws"},
                            "summary": "The user's read marker in one conversation.",
                            "messages": ws("readMarker")},
            "receiveTyping": {"action": "receive", "channel": {"$ref": "#/channels/ws"},
                              "summary": "The user is typing to a peer, or stopped.",
                              "messages": ws("typingNotice")},
            "receiveWatch": {"action": "receive", "channel": {"$ref": "#/channels/ws"},
                             "summary": "The users whose presence this connection follows.",
                             "messages": ws("watch")},
            "answerPoll": {"action": "send", "channel": {"$ref": "#/channels/poll"},
                           "summary": "The messages and events after `since`, the typing signals that came "
                                      "while it waited, the next cursor, the unread count, or an error.",
                           "messages": [{"$ref": "#/channels/poll/messages/answer"},
                                        {"$ref": "#/channels/poll/messages/error"}]},
        },
        "components": {"schemas": found, "messages": messages},
    }
