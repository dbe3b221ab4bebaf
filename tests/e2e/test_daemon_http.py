"""The daemon's port refuses, as the RFCs say, what a lenient server would
serve: raw bytes on a socket, and the status line and body that come back."""

import socket

import orjson
import pytest

from tests.e2e.helpers import raw_exchange
from harness.system import System
from tests.timing import PATIENCE


def answer(system: System, request: bytes) -> tuple[bytes, dict[str, str], dict]:
    """The status line, headers and JSON body of the daemon's answer to raw bytes."""
    status, headers, body = raw_exchange(system.daemon_port, request)
    return status, headers, orjson.loads(body)


def handshake(method: str, token: str) -> bytes:
    return (f"{method} /v1/ws?token={token} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            "Content-Length: 0\r\n\r\n").encode()


def test_a_websocket_handshake_by_post_gets_405_allow_get(system, users):
    status, headers, body = answer(system, handshake("POST", system.token(users("u"))))
    assert status == b"HTTP/1.1 405 Method Not Allowed" and headers["allow"] == "GET"
    assert body["error"] == "method_not_allowed"


def test_a_websocket_handshake_by_get_still_switches(system, users):
    with socket.create_connection(("127.0.0.1", system.daemon_port), timeout=PATIENCE) as sock:
        sock.sendall(handshake("GET", system.token(users("u"))))
        assert sock.recv(65536).startswith(b"HTTP/1.1 101 Switching Protocols\r\n")


@pytest.mark.parametrize("path", ["/healthz", "/v1/ws", "/v1/poll?timeout=0"])
def test_http_1_1_without_host_gets_400(system, path):
    status, headers, body = answer(system, f"GET {path} HTTP/1.1\r\n\r\n".encode())
    assert status == b"HTTP/1.1 400 Bad Request" and headers["connection"] == "close"
    assert body == {"error": "bad_request", "message": "an HTTP/1.1 request needs a Host header"}


def test_http_1_0_without_host_is_served(system):
    status, _, body = answer(system, b"GET /healthz HTTP/1.0\r\n\r\n")
    assert status == b"HTTP/1.1 200 OK" and body["status"] == "ok"


@pytest.mark.parametrize("request_bytes", [
    b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", b"GET /healthz HTTP/0.9\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/3.0\r\nHost: x\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2 with prior knowledge: its connection preface
])
def test_a_request_of_another_version_than_1_x_gets_505(system, request_bytes):
    status, _, body = answer(system, request_bytes)
    assert status == b"HTTP/1.1 505 HTTP Version Not Supported"
    assert body == {"error": "http_version_not_supported", "message": "this server speaks HTTP/1.1 (and HTTP/1.0)"}
