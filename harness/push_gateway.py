"""A push gateway of our own, for the tests and the push benchmark, in a process
of its own: the gateway side of the Matrix Push Gateway API (``POST
/_matrix/push/v1/notify``, docs/push.md), which records every notification it
takes and answers as the spec says, or fails, stalls and rejects as it is told.
Sygnal cannot be installed here, and a real one would push to phones.

    python -m harness.push_gateway      prints "gateway listening on http://127.0.0.1:<port>"

``GET /_gateway/received``: ``{"received": [record, ...], "refused": n, "stalled": n}``,
every notification taken, in order, each record ``{"arrival": s, "key": its
Idempotency-Key, "notification": {...}}`` (``arrival``: this process's
``time.time()`` when it was taken, for the benchmark's push delays).
``POST /_gateway/mode`` ``{"mode": "ok" | "fail" | "stall", "reject": [pushkey]}``:
answer 200 (with ``rejected`` naming those of the pushkeys), 500, or hold each
request until the mode changes (at most ``STALL_MAX_SECONDS``). Keep-alive
(HTTP/1.1): the pusher's client reuses its connections, as it would with Sygnal.

``PushGateway`` starts one and reads it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from harness.servers import ROOT
from harness.waiting import PATIENCE

NOTIFY_PATH = "/_matrix/push/v1/notify"
RECEIVED_PATH, MODE_PATH = "/_gateway/received", "/_gateway/mode"
MODES = ("ok", "fail", "stall")
# A held request is let go after this even if nobody changes the mode: a test or
# a benchmark that died holding the gateway must not leave its requests hanging.
STALL_MAX_SECONDS = 120.0
# Records kept at most: each holds its whole notification (about 2 KB of Python
# objects), and a benchmark run takes tens of thousands.
RECEIVED_MAX = 200_000


class GatewayRecord:
    """What the gateway process has taken and been told, behind one lock."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.received: list[dict] = []
        self.mode = "ok"
        self.reject: set[str] = set()
        self.refused = 0  # requests answered 500
        self.stalled = 0  # requests held by "stall"


RECORD = GatewayRecord()


class GatewayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet: its users read RECEIVED_PATH
        pass

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self) -> object:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"null")

    def do_GET(self) -> None:
        if self.path == RECEIVED_PATH:
            with RECORD.lock:
                body = {"received": list(RECORD.received), "refused": RECORD.refused, "stalled": RECORD.stalled}
            self._answer(200, body)
        else:
            self._answer(404, {"errcode": "M_UNRECOGNIZED"})

    def do_POST(self) -> None:
        body = self._json()
        if self.path == MODE_PATH:
            if not (isinstance(body, dict) and body.get("mode") in MODES):
                self._answer(400, {"errcode": "M_BAD_JSON"})
                return
            with RECORD.lock:
                RECORD.mode = body["mode"]
                RECORD.reject = set(body.get("reject", []))
                RECORD.lock.notify_all()
            self._answer(200, {})
            return
        if self.path != NOTIFY_PATH or not isinstance(body, dict):
            self._answer(404, {"errcode": "M_UNRECOGNIZED"})
            return
        self._answer(*self._take(body.get("notification") or {}))

    def _take(self, notification: dict) -> tuple[int, dict]:
        arrival = time.time()
        with RECORD.lock:
            if RECORD.mode == "stall":
                RECORD.stalled += 1
                deadline = time.monotonic() + STALL_MAX_SECONDS
                while RECORD.mode == "stall" and time.monotonic() < deadline:
                    RECORD.lock.wait(deadline - time.monotonic())
                arrival = time.time()  # it is taken now, not when it came in
            if RECORD.mode != "ok":
                RECORD.refused += 1
                return 500, {"errcode": "M_UNKNOWN"}
            if len(RECORD.received) < RECEIVED_MAX:
                RECORD.received.append({"arrival": round(arrival, 4), "key": self.headers.get("Idempotency-Key"),
                                        "notification": notification})
            rejected = [d["pushkey"] for d in notification.get("devices", []) if d.get("pushkey") in RECORD.reject]
        return 200, {"rejected": rejected}


class GatewayServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        # A client that drops a kept-alive connection (the pusher's, after a 500 or
        # when it is killed) resets it under the next read: nothing went wrong here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main() -> None:
    server = GatewayServer(("127.0.0.1", 0), GatewayHandler)
    print(f"gateway listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


class PushGateway:
    """The gateway above, run as a process of its own, read and told over HTTP."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.push_gateway"], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("gateway listening on "):
            self.close()
            raise RuntimeError(f"the push gateway did not start: {line!r}")
        self.url = line.rsplit(" ", 1)[1].strip()

    def state(self) -> dict:
        """``{"received": [record, ...], "refused": n, "stalled": n}`` (the module's doc)."""
        return httpx.get(self.url + RECEIVED_PATH, timeout=PATIENCE).json()

    def received(self) -> list[dict]:
        return self.state()["received"]

    def to(self, pushkey: str) -> list[dict]:
        """The records of the notifications taken for ``pushkey``."""
        return [r for r in self.received() if r["notification"]["devices"][0]["pushkey"] == pushkey]

    def mode(self, mode: str, reject: Iterable[str] = ()) -> None:
        httpx.post(self.url + MODE_PATH, json={"mode": mode, "reject": list(reject)},
                   timeout=PATIENCE).raise_for_status()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(PATIENCE)


if __name__ == "__main__":
    main()
