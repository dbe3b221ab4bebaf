"""The one error vocabulary of every process: the base of our exceptions, the
one JSON shape of an error answer, and the WebSocket close codes.

An error answer, on the write API and on the daemons alike, is
``{"error": code, "message": text, "field": name?}`` (README, "Public contract"),
with the few fields a code documents (``partition`` with ``wrong_partition``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum

import orjson


class ChatError(Exception):
    """The base of the exceptions this project raises on purpose."""


class Refused(ChatError):
    """A request refused with an HTTP status and the JSON error body."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None, extra: Mapping[str, object] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> bytes:
        return error_body(self.code, self.message, self.field, self.extra)


def error_body(code: str, message: str, field: str | None = None, extra: Mapping[str, object] | None = None) -> bytes:
    """The JSON error body: the one place it is built. ``extra``: the fields its code documents."""
    body: dict[str, object] = {"error": code, "message": message}
    if field is not None:
        body["field"] = field
    if extra:
        body.update(extra)
    return orjson.dumps(body)


class CloseCode(IntEnum):
    """WebSocket close codes the daemons send (README, "Public contract", "Daemons")."""

    NORMAL = 1000
    PROTOCOL_ERROR = 1002
    INVALID_DATA = 1007  # text, or a close reason, that is not UTF-8
    POLICY = 1008  # too many inbound frames
    TOO_BIG = 1009  # an inbound frame over CHAT_WS_MAX_FRAME_BYTES
    SERVER_ERROR = 1011
    RESTART = 1012  # the daemon is restarting: reconnect with since
    TRY_AGAIN = 1013  # this daemon is behind your since, or its stores did not answer: retry
    TOKEN_EXPIRED = 4001  # the token's exp passed: reconnect with a new token and since
    SLOW_CONSUMER = 4008  # fell CHAT_SEND_BUFFER_MAX_BYTES behind
    UNAUTHORIZED = 4401  # no valid `auth` frame first (the handshake's 401, after the upgrade)
    WRONG_PARTITION = 4421  # the auth frame's user is served elsewhere (the 421); reason: {"partition": k}
