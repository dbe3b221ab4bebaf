"""What the write API's port bounds, seen from a raw socket: a request head
of at most 16 KiB however it is sent, and connections that send nothing,
which it closes and which, past its connection limit, leave it answering in
JSON and serving its health checks."""

from __future__ import annotations

import contextlib
import socket

import httpx
import orjson
import psutil
import pytest

from chat.serve import HEAD_MAX_BYTES
from harness.system import running_system
from tests.timing import PATIENCE, S, eventually_sync


def head(size: int) -> bytes:
    """A GET /healthz head of exactly ``size`` bytes, its blank line included."""
    start = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: "
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


def answer(port: int, *writes: bytes) -> bytes:
    """What the server says to these writes (one ``send`` each), once it has closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for data in writes:
            sock.sendall(data)
        said = b""
        with contextlib.suppress(ConnectionResetError):  # closed with bytes of ours unread: a reset may follow
            while chunk := sock.recv(65536):
                said += chunk
        return said


def assert_too_large(said: bytes) -> None:
    status, _, body = said.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 431 ") and b"\r\ncontent-type: application/json" in status.lower()
    assert orjson.loads(body)["error"] == "headers_too_large"


OVER = head(HEAD_MAX_BYTES + 1)
WRITES = {
    "one byte over, in one write": [OVER],
    "one byte over, its blank line cut in two writes": [OVER[:-2], b"\r\n"],
    "one byte over, in 1 KiB writes": [OVER[i:i + 1024] for i in range(0, len(OVER), 1024)],
    "100 KB in one write": [head(100_000)],
}


@pytest.mark.parametrize("writes", WRITES.values(), ids=WRITES.keys())
@pytest.mark.parametrize("port", ["api", "daemon"])
def test_a_head_over_16_kib_gets_431_and_the_connection_closed(system, port, writes):
    assert_too_large(answer(getattr(system, f"{port}_port"), *writes))


@pytest.mark.parametrize("port", ["api", "daemon"])
def test_a_head_of_16_kib_is_served(system, port):
    said = answer(getattr(system, f"{port}_port"), head(HEAD_MAX_BYTES))
    status, _, body = said.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200 ") and orjson.loads(body)["status"] == "ok"


LIMIT = 20
IDLE_SECONDS = 3 * S  # long enough for the checks made while the silent sockets hold the limit


def accepted(pid: int, port: int, peers: set[int]) -> set[int]:
    """Which of the client ports ``peers`` the process ``pid`` holds a connection from on ``port``."""
    return {c.raddr.port for c in psutil.Process(pid).net_connections("tcp")
            if c.laddr.port == port and c.raddr and c.raddr.port in peers}


def test_silent_sockets_past_the_connection_limit_get_json_503s_then_are_closed(dbs, users):
    with running_system(dbs, daemons=0, apis=1, CHAT_API_MAX_CONNECTIONS=str(LIMIT),
                        CHAT_HTTP_IDLE_SECONDS=str(IDLE_SECONDS), CHAT_RATE_LIMIT_PER_SECOND="0") as s:
        alice, bob = users("alice"), users("bob")
        auth = {"Authorization": f"Bearer {s.token(alice)}"}

        def post() -> httpx.Response:
            return httpx.post(f"{s.api_url}/v1/messages", json={"to": bob, "body": "hi"}, headers=auth,
                              timeout=PATIENCE)

        silent = [socket.create_connection(("127.0.0.1", s.api_port)) for _ in range(LIMIT + 2)]
        try:
            # The kernel completes a connect before the process accepts it:
            # the silent sockets count toward the limit once it holds them all.
            peers = {sock.getsockname()[1] for sock in silent}
            eventually_sync(lambda: accepted(s.procs["api_0"].pid, s.api_port, peers) == peers,
                            "the API process holds every silent socket")

            reply = post()
            assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
            assert reply.headers["content-type"] == "application/json"
            assert reply.json() == {"error": "overloaded", "message": "this process is at its connection limit; retry"}
            healthz = httpx.get(f"{s.api_url}/healthz", timeout=PATIENCE)
            assert healthz.status_code == 200 and healthz.json() == {"status": "ok"}
            readyz = httpx.get(f"{s.api_url}/readyz", timeout=PATIENCE)
            assert readyz.status_code == 200 and readyz.json()["status"] == "ok"
            assert httpx.get(f"{s.api_url}/metrics", timeout=PATIENCE).status_code == 200
            for sock in silent:  # all of them held the limit throughout
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)

            for sock in silent:
                sock.settimeout(PATIENCE)
                assert sock.recv(1) == b""  # closed by the server, nothing said
        finally:
            for sock in silent:
                sock.close()
        reply = post()
        assert reply.status_code == 201 and reply.json()["to"] == bob
