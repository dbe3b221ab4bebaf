"""The WebSocket opening handshake (RFC 6455 section 4.2), shared by the
daemon's ``/v1/ws`` and the conformance testee (``daemon.testee``)."""

from __future__ import annotations

from websockets.datastructures import Headers
from websockets.http11 import Request as WsRequest
from websockets.server import ServerProtocol

from chat.errors import error_body
from daemon.connection import Connection
from daemon.http_phase import Request


def accept(conn: Connection, path: str, request: Request) -> bytes | None:
    """The 101 response to a valid handshake; None once ``conn`` has been
    answered why not (426 for another protocol version, else the library's
    status and reason). Authentication is the caller's, after this."""
    version = request.headers.get("sec-websocket-version")
    if version is not None and version.strip() != "13":
        # RFC 6455 4.2.2: say which version this server speaks, so the client can retry with it
        conn.respond(426, error_body("unsupported_websocket_version", "this server speaks WebSocket version 13"),
                     False, {"Sec-WebSocket-Version": "13"})
        return None
    response = ServerProtocol().accept(WsRequest(path, Headers(request.headers)))
    if response.status_code != 101:  # not a valid WebSocket handshake: the library says why
        conn.respond(response.status_code, error_body("bad_handshake", response.body.decode().strip()), False)
        return None
    return response.serialize()
