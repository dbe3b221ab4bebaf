"""The OpenAPI document of the write API. tests/api/test_openapi.py keeps it true:
every route is documented, every documented route exists, and the status codes
the tests observe are the documented ones."""

_ERROR = {"$ref": "#/components/schemas/Error"}


def _err(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


_MESSAGE_RESPONSES = {
    "201": {"description": "Stored (MySQL committed; Mongo written or queued in the outbox)",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Message"}}}},
    "200": {"description": "A retry: the original message for this (sender, client_msg_id); nothing new stored",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Message"}}}},
    "400": _err("Malformed JSON: syntax, NaN, duplicate keys, invalid UTF-8, lone surrogates, deep nesting"),
    "401": _err("Missing, forged, expired or alg:none token"),
    "409": _err("client_msg_id reused by this sender for a different message"),
    "413": _err("Request body over 16 KiB (CHAT_REQUEST_MAX_BYTES)"),
    "422": _err("Valid JSON of the wrong shape; `field` names the field"),
    "429": _err("Sender over its rate limit; see Retry-After"),
    "503": _err("MySQL down or slow, the writer queue full, or the writer process away past "
                "CHAT_WRITER_WAIT_SECONDS: nothing stored (error mysql_unavailable, overloaded, writer_unavailable); "
                "or the COMMIT failed, or the writer process died holding the request, and it may have been "
                "stored (outcome_unknown: retry with the same client_msg_id); see Retry-After"),
}

OPENAPI = {
    "openapi": "3.1.0",
    "info": {"title": "chat-delivery write API", "version": "1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT (HS256, sub, exp)"}},
        "schemas": {
            "NewMessage": {
                "type": "object", "additionalProperties": False, "required": ["to", "body"],
                "properties": {
                    "to": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
                    "body": {"type": "string", "minLength": 1, "maxLength": 4000},
                    "client_msg_id": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9_.:-]{1,64}$"},
                },
            },
            "Message": {
                "type": "object",
                "required": ["type", "id", "from", "to", "body", "created_at", "client_msg_id"],
                "properties": {
                    "type": {"const": "message"},
                    "id": {"type": "string", "description": "Opaque; also a valid `since` for the daemons"},
                    "from": {"type": "string"}, "to": {"type": "string"}, "body": {"type": "string"},
                    "created_at": {"type": "string", "format": "date-time"},
                    "client_msg_id": {"type": ["string", "null"]},
                },
            },
            "History": {
                "type": "object", "required": ["messages", "next_before"],
                "properties": {
                    "messages": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
                    "next_before": {"type": ["string", "null"], "description": "Pass as `before` for the next page"},
                },
            },
            "Conversations": {
                "type": "object", "required": ["conversations"],
                "properties": {"conversations": {"type": "array", "maxItems": 50, "items": {
                    "type": "object", "required": ["with", "last"],
                    "properties": {"with": {"type": "string", "description": "The peer"},
                                   "last": {"$ref": "#/components/schemas/Message"}},
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
            "Error": {
                "type": "object", "required": ["error", "message"],
                "properties": {"error": {"type": "string"}, "message": {"type": "string"}, "field": {"type": "string"}},
            },
        },
    },
    "paths": {
        "/v1/messages": {
            "post": {
                "summary": "Send a one-to-one message as the token's user",
                "security": [{"bearer": []}],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/NewMessage"}}}},
                "responses": _MESSAGE_RESPONSES,
            },
            "get": {
                "summary": "Conversation history with one peer, newest first",
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "with", "in": "query", "required": True, "schema": {"type": "string"}},
                    {"name": "before", "in": "query", "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
                ],
                "responses": {
                    "200": {"description": "A page", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/History"}}}},
                    "401": _err("Missing or invalid token"),
                    "422": _err("Bad parameter; `field` names it"),
                    "503": _err("MySQL unavailable"),
                },
            },
        },
        "/v1/conversations": {
            "get": {
                "summary": "The caller's conversations, newest first (at most 50), each with its last message",
                "security": [{"bearer": []}],
                "responses": {
                    "200": {"description": "The list", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Conversations"}}}},
                    "401": _err("Missing or invalid token"),
                    "503": _err("MySQL unavailable"),
                },
            },
        },
        "/v1/client-config": {
            "get": {
                "summary": "Where the web client finds the daemons, whether dev login is on, and (with a "
                           "token) the caller's partition",
                "security": [{}, {"bearer": []}],
                "responses": {
                    "200": {"description": "The config", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ClientConfig"}}}},
                    "401": _err("A token was sent and is invalid or expired"),
                },
            },
        },
        "/v1/dev/token": {
            "post": {
                "summary": "Development only (CHAT_DEV_LOGIN with CHAT_DEV_MODE): a token for any user, no password",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False, "required": ["user"],
                    "properties": {"user": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}}}}}},
                "responses": {
                    "200": {"description": "A token valid for 12 h", "content": {"application/json": {"schema": {
                        "type": "object", "required": ["token", "user"],
                        "properties": {"token": {"type": "string"}, "user": {"type": "string"}}}}}},
                    "400": _err("Malformed JSON"),
                    "404": _err("Dev login is off (always in production)"),
                    "422": _err("`user` is not a user id; `field` names it"),
                },
            },
        },
        "/healthz": {"get": {"summary": "The process is alive", "responses": {"200": {"description": "ok"}}}},
        "/readyz": {"get": {"summary": "Both databases answer, and the writer process where there is one",
                            "responses": {"200": {"description": "ready"},
                                          "503": {"description": "a database is down"}}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text format"}}}},
        "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1"}}}},
    },
}
