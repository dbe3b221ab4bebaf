"""A push gateway of the tests' own, in its own process: the gateway side of the
Matrix Push Gateway API (``POST /_matrix/push/v1/notify``), which records what it
is sent and answers as the spec says, or as it is told.

    python -m tests.push.gateway        prints "gateway listening on http://127.0.0.1:<port>"

``GET /_test/received``: every notification taken, in order, with its
``Idempotency-Key``. ``POST /_test/mode`` ``{"mode": "ok" | "fail" | "stall", "reject": [pushkey]}``:
answer 200 (with ``rejected`` naming those pushkeys), 500, or hold each request
until the mode changes.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class State:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.received: list[dict] = []
        self.mode = "ok"
        self.reject: set[str] = set()
        self.refused = 0  # requests answered 500
        self.stalled = 0  # requests held by "stall" so far


STATE = State()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read /_test/received
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
        if self.path == "/_test/received":
            with STATE.lock:
                self._answer(200, {"received": STATE.received, "refused": STATE.refused,
                                   "stalled": STATE.stalled})
        else:
            self._answer(404, {"errcode": "M_UNRECOGNIZED"})

    def do_POST(self) -> None:
        if self.path == "/_test/mode":
            body = self._json()
            with STATE.lock:
                STATE.mode = body["mode"]
                STATE.reject = set(body.get("reject", []))
                STATE.lock.notify_all()
            self._answer(200, {})
            return
        if self.path != "/_matrix/push/v1/notify":
            self._answer(404, {"errcode": "M_UNRECOGNIZED"})
            return
        body = self._json()
        with STATE.lock:
            if STATE.mode == "stall":
                STATE.stalled += 1
                STATE.lock.notify_all()
            while STATE.mode == "stall":
                STATE.lock.wait()
            if STATE.mode == "fail":
                STATE.refused += 1
                self._answer(500, {"errcode": "M_UNKNOWN"})
                return
            notification = body["notification"]
            STATE.received.append({"key": self.headers.get("Idempotency-Key"), "notification": notification})
            rejected = [d["pushkey"] for d in notification.get("devices", []) if d.get("pushkey") in STATE.reject]
        self._answer(200, {"rejected": rejected})


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"gateway listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
