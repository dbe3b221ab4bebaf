"""A process takes connections on the shared port only once it can serve them,
and an auxiliary port that is taken (its own /metrics) does not stop it serving."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from harness.servers import ROOT, free_port, stop, wait_port
from harness.system import running_system
from tests.timing import PATIENCE, S, eventually_sync


def test_processes_whose_metrics_port_is_taken_serve_without_it_and_say_so(dbs, users):
    with socket.socket() as squatter:  # another program on the metrics port
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with running_system(dbs, daemons=1, apis=1, CHAT_METRICS_PORT=str(port)) as s:
            alice, bob = users("alice"), users("bob")
            reply = httpx.post(f"{s.api_url}/v1/messages", json={"to": bob, "body": "hi"},
                               headers={"Authorization": f"Bearer {s.token(alice)}"})
            assert reply.status_code == 201
            # waits for the message (a 201 is the MySQL commit; delivery follows)
            poll = httpx.get(s.poll_url, params={"token": s.token(bob), "since": "0", "timeout": 10}, timeout=PATIENCE)
            assert poll.status_code == 200 and [m["id"] for m in poll.json()["messages"]] == [reply.json()["id"]]
            for name in ("api_0", "daemon_0"):
                assert s.procs[name].poll() is None, f"{name} exited"
                log = (s.logdir / f"{name}.log").read_text()
                line = next(line for line in log.splitlines() if "event=metrics_port_failed" in line)
                assert "level=ERROR" in line and f"port={port} " in line
                assert "error='Address already in use'" in line and "action=serving_without_metrics_port" in line


# An ASGI app whose start-up waits for a file: the shared port's state can be
# looked at while a process is still starting.
SLOW_START = textwrap.dedent("""
    import asyncio, os, sys
    from chat.serve import serve

    started, gate, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await receive()
            open(started, "w").close()
            # the gate is a FIFO: reading it returns once the test writes to it
            await asyncio.to_thread(lambda: open(gate).read())
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"serving"})

    serve(app, "127.0.0.1", port)
""")


def test_the_shared_port_refuses_connections_until_start_up_is_done(tmp_path):
    started, gate, port = tmp_path / "started", tmp_path / "gate", free_port()
    os.mkfifo(gate)
    proc = subprocess.Popen([sys.executable, "-c", SLOW_START, str(started), str(gate), str(port)], cwd=ROOT)
    try:
        eventually_sync(lambda: started.exists() or proc.poll() is not None, "the app's start-up began")
        assert proc.poll() is None
        # Bound, still starting: a connection is refused, not queued for a
        # process that may yet fail and drop it.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2 * S)
        with open(gate, "w") as opening:
            opening.write("go")
        wait_port(port, 20, proc)
        assert httpx.get(f"http://127.0.0.1:{port}/").text == "serving"
    finally:
        stop(proc)


# An ASGI app served by serve() with nothing but its defaults.
PLAIN = textwrap.dedent("""
    import sys
    from chat.serve import serve

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"7")]})
        await send({"type": "http.response.body", "body": b"serving"})

    serve(app, "127.0.0.1", int(sys.argv[1]))
""")


def _answer_to_a_head_in_parts(port: int, parts: list[bytes]) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5 * S) as sock:
        for part in parts:
            sock.sendall(part)
            time.sleep(0.1)  # pacing: each part its own read on the server
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_serve_with_its_defaults_bounds_a_head_that_arrives_in_parts():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", PLAIN, str(port)], cwd=ROOT)
    try:
        wait_port(port, 20, proc)
        head = [b"GET / HTTP/1.1\r\nHost: x\r\n", b"X-A: 1\r\n\r\n"]
        answer = _answer_to_a_head_in_parts(port, head)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"serving")
        too_long = [b"GET / HTTP/1.1\r\nHost: x\r\n"] + [b"X-Pad: " + b"a" * 4000 + b"\r\n"] * 5
        answer = _answer_to_a_head_in_parts(port, too_long)
        assert answer.startswith(b"HTTP/1.1 431 ") and b'"error":"headers_too_large"' in answer
        assert b"request head over the limit (16 KiB)" in answer
        assert proc.poll() is None
    finally:
        stop(proc)


@pytest.mark.parametrize("hosts,expected", [
    ({"CHAT_METRICS_HOST": ""}, "127.0.0.1"),
    ({"CHAT_METRICS_HOST": "127.0.0.2"}, "127.0.0.2"),
    ({"CHAT_METRICS_HOST": "127.0.0.3", "CHAT_WRITER_METRICS_HOST": "127.0.0.2"}, "127.0.0.2"),
], ids=["none", "shared", "the writer's own"])
def test_the_writer_serves_its_metrics_on_its_metrics_host_or_the_loopback(dbs, hosts, expected):
    # The writer listens on a Unix socket only: its /metrics port is on the
    # loopback unless CHAT_WRITER_METRICS_HOST, else CHAT_METRICS_HOST, says
    # where, never on the API's address.
    with running_system(dbs, daemons=0, apis=0, writer=True, **hosts, CHAT_API_HOST="127.0.0.3") as s:
        url = f"http://{expected}:{s.writer_metrics_port}/metrics"
        scraped = eventually_sync(lambda: _scrape(url), f"the writer's /metrics on {expected}")
        assert "chat_writer" in scraped
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.3:{s.writer_metrics_port}/metrics", timeout=PATIENCE)


def _scrape(url: str) -> str | None:
    try:
        r = httpx.get(url, timeout=PATIENCE)
    except httpx.ConnectError:
        return None
    return r.text if r.status_code == 200 else None
