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
_RETRY_AFTER = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
_WWW_AUTHENTICATE = {"WWW-Authenticate": {"$ref": "#/components/headers/WWW-Authenticate"}}


def pattern(regex: re.Pattern[str]) -> str:
    """``regex``, which the API applies with fullmatch, as a JSON Schema pattern (a search: anchored here)."""
    return f"^(?:{regex.pattern})$"


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
                        "client_msg_id": {"type": ["string", "null"], "pattern": pattern(rules.CLIENT_MSG_ID),
                                          "description": "1-64 characters of [A-Za-z0-9_.:-]: a retry with "
                                                         "the same one stores nothing new"},
                    },
                },
                "Message": {
                    "type": "object",
                    "required": ["type", "id", "from", "to", "body", "created_at", "client_msg_id"],
                    "properties": {
                        "type": {"const": "message"},
                        "id": {"type": "string", "description": "Opaque; also a valid `since` for the daemons"},
                        "from": user_id, "to": user_id, "body": {"type": "string"},
                        "created_at": {"type": "string", "format": "date-time"},
                        "client_msg_id": {"type": ["string", "null"]},
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
                        "type": "object", "required": ["with", "last"],
                        "properties": {"with": {**user_id, "description": "The peer"}, "last": _MESSAGE},
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
                        "422": _err("Valid JSON of the wrong shape; `field` names the field",
                                    "invalid_field", "invalid_body"),
                        "429": _err("Sender over its rate limit (CHAT_RATE_LIMIT_PER_SECOND)", "rate_limited",
                                    headers=_RETRY_AFTER),
                        "503": _err("MySQL down or slow, another writer holding the sender's partition's lock "
                                    "for the whole lock wait (CHAT_DB_TIMEOUT_SECONDS), the writer queue full, "
                                    "the writer process away past CHAT_WRITER_WAIT_SECONDS, or the process at "
                                    "its connection limit: nothing stored (mysql_unavailable, partition_busy, "
                                    "overloaded, writer_unavailable); or the COMMIT failed, or the writer process "
                                    "died holding the request, and it may have been stored (outcome_unknown: "
                                    "retry with the same client_msg_id)",
                                    "mysql_unavailable", "partition_busy", "overloaded", "writer_unavailable",
                                    "outcome_unknown", headers=_RETRY_AFTER),
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
            "/v1/conversations": {
                "get": {
                    "summary": "The caller's conversations, newest first (at most 50), each with its last message",
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
OPENAPI = document(Settings.model_fields["body_max_chars"].default, Settings.model_fields["request_max_bytes"].default)
