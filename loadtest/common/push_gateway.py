"""A push gateway of the benchmark's own, in its own process: the gateway side of
the Matrix Push Gateway API (``POST /_matrix/push/v1/notify``, docs/push.md),
which records every notification it takes with its arrival time, and answers
200, or 500, or holds each request, as it is told.

    python -m loadtest.common.push_gateway   prints "gateway listening on http://127.0.0.1:<port>"

``GET /_bench/received``: ``{"received": [[arrival, key, event_id, pushkey, unread], ...], "refused": n,
"stalled": n}``, every notification taken in order (``arrival``: this process's ``time.time()`` when the
request's body was read; ``key``: its ``Idempotency-Key``). ``POST /_bench/mode`` ``{"mode": "ok" | "fail"
| "stall"}``: answer 200, 500, or hold each request until the mode changes (at most ``STALL_MAX_SECONDS``).
Keep-alive (HTTP/1.1): the pusher's client reuses its connections, as it would with Sygnal.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NOTIFY_PATH = "/_matrix/push/v1/notify"
STALL_MAX_SECONDS = 120.0  # a held request is let go after this even if nobody changes the mode
RECEIVED_MAX = 2_000_000  # records kept at most (a run records tens of thousands)


class State:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.received: list[list] = []
        self.mode = "ok"
        self.refused = 0  # requests answered 500
        self.stalled = 0  # requests held by "stall"


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet: the benchmark reads /_bench/received
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
        if self.path == "/_bench/received":
            with STATE.lock:
                body = {"received": list(STATE.received), "refused": STATE.refused, "stalled": STATE.stalled}
            self._answer(200, body)
        else:
            self._answer(404, {"errcode": "M_UNRECOGNIZED"})

    def do_POST(self) -> None:
        body = self._json()
        if self.path == "/_bench/mode":
            assert isinstance(body, dict) and body["mode"] in ("ok", "fail", "stall")
            with STATE.lock:
                STATE.mode = body["mode"]
                STATE.lock.notify_all()
            self._answer(200, {})
            return
        if self.path != NOTIFY_PATH or not isinstance(body, dict):
            self._answer(404, {"errcode": "M_UNRECOGNIZED"})
            return
        arrival = time.time()
        with STATE.lock:
            if STATE.mode == "stall":
                STATE.stalled += 1
                deadline = time.monotonic() + STALL_MAX_SECONDS
                while STATE.mode == "stall" and time.monotonic() < deadline:
                    STATE.lock.wait(deadline - time.monotonic())
                arrival = time.time()  # it is taken now, not when it came in
            if STATE.mode != "ok":
                STATE.refused += 1
                refuse = True
            else:
                refuse = False
                note = body.get("notification", {})
                devices = note.get("devices") or [{}]
                if len(STATE.received) < RECEIVED_MAX:
                    STATE.received.append([round(arrival, 4), self.headers.get("Idempotency-Key"),
                                           note.get("event_id"), devices[0].get("pushkey"),
                                           note.get("counts", {}).get("unread")])
        if refuse:
            self._answer(500, {"errcode": "M_UNKNOWN"})
        else:
            self._answer(200, {"rejected": []})


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"gateway listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
