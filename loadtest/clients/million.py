"""One process of the million-connection load: up to ~19,000 WebSocket
clients on one epoll loop, with the least state Python allows.

A connection is a file descriptor and a few numbers in flat arrays indexed
by its slot (one user per slot): its phase, its resume point, its backoff.
No socket object, no protocol object, no buffer while idle (bytes of an
unfinished frame are kept in a dict only until the rest comes). It speaks
what a chat client must: the handshake, the hello (its cursor is the resume
point), text frames (only the id is read), pongs to pings, the close
handshake, then a reconnect with ``since`` after a jittered backoff.

Driven by ``loadtest.million`` over stdin/stdout, one JSON object a line:
``{"target": n}`` connects slots 0..n-1; ``{"mark": t}`` starts counting
reconnects from wall time t; ``{"stop": path}`` writes what was received
(slot and id of every message frame, repeats included) and exits. A status
line goes out every second.
"""

from __future__ import annotations

import array
import contextlib
import base64
import errno
import hashlib
import heapq
import hmac
import os
import random
import resource
import select
import socket
import sys
import time

import orjson

from loadtest.clients.websocket import head_status, masked, split_messages, upgrade_request

IN_FLIGHT = 128  # handshakes under way at once, per process: the listen backlogs stay short
HANDSHAKE_TIMEOUT = 30.0
TOKEN_TTL = 4 * 3600
PONG_EMPTY = b"\x8a\x80\x00\x00\x00\x00"  # masked with a zero key: the payload goes as is
CLOSE_REPLY = b"\x88\x80\x00\x00\x00\x00"
IDLE, CONNECTING, HANDSHAKE, UPGRADED, OPEN = 0, 1, 2, 3, 4  # UPGRADED: the 101 read, the hello not yet
NO_SINCE = -1


def request(host: str, port: int, token: str, since: int) -> bytes:
    return upgrade_request(host, port, f"/v1/ws?since={since}" if since != NO_SINCE else "/v1/ws?",
                           f"Authorization: Bearer {token}\r\n")


def mint(secret: bytes, user: str, ttl_seconds: int) -> str:
    """An HS256 token as ``chat.auth.mint`` makes it (a test holds them to
    ``chat.auth.verify``). By hand: PyJWT and the ``cryptography`` it loads
    would add 9 MB to each of the 60-odd load processes."""
    now = int(time.time())
    head = b"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"  # {"alg":"HS256","typ":"JWT"}
    body = base64.urlsafe_b64encode(orjson.dumps({"sub": user, "iat": now, "exp": now + ttl_seconds})).rstrip(b"=")
    signed = head + b"." + body
    signature = base64.urlsafe_b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).rstrip(b"=")
    return (signed + b"." + signature).decode()


def backoff(attempt: int, rng: random.Random) -> float:
    """The reference client's: 0.1 s doubling to 2 s, jittered by half either way."""
    return min(2.0, 0.1 * 2 ** attempt) * rng.uniform(0.5, 1.5)


def pss_kb() -> int:
    """This process's proportional set size: its own pages, and its share of
    those it shares (the interpreter, libraries) with the other load processes."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


class Clients:
    def __init__(self, prefix: str, size: int, host: str, port: int, source: str, secret: str):
        self.prefix, self.host, self.port, self.source = prefix, host, port, source
        self.secret = secret.encode()
        self.addr = (host, port)
        self.fd = array.array("i", [-1]) * size
        self.phase = bytearray(size)
        self.since = array.array("q", [NO_SINCE]) * size
        self.attempt = bytearray(size)
        self.started = array.array("d", [0.0]) * size  # handshake start, for its timeout
        self.slot_of: dict[int, int] = {}  # fd -> slot
        self.partial: dict[int, bytes] = {}  # slot -> bytes of an unfinished head or frame
        self.due: list[tuple[float, int]] = []  # (monotonic time, slot) to (re)connect
        self.in_flight: set[int] = set()
        self.got_slot, self.got_id = array.array("i"), array.array("q")  # every message frame
        self.target = 0
        self.open = self.failed = self.refused = self.closed = self.hellos = self.timeouts = 0
        self.mark: float | None = None  # wall time from which reconnects are counted
        self.back, self.last_back = 0, 0.0
        self.epoll = select.epoll()
        self.rng = random.Random()

    def user(self, slot: int) -> str:
        return f"{self.prefix}{slot}"

    def grow(self, target: int) -> None:
        now = time.monotonic()
        for slot in range(self.target, min(target, len(self.fd))):
            self.due.append((now, slot))
        heapq.heapify(self.due)
        self.target = max(self.target, min(target, len(self.fd)))

    def start_due(self) -> None:
        now = time.monotonic()
        while self.due and self.due[0][0] <= now and len(self.in_flight) < IN_FLIGHT:
            _, slot = heapq.heappop(self.due)
            self.connect(slot)

    def connect(self, slot: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        code: int | None  # an OSError may carry no errno
        try:
            # bind() picks a free port from a random offset. Left to connect()
            # (IP_BIND_ADDRESS_NO_PORT), a retry got the port just freed back:
            # the same 4-tuple, so the same SO_REUSEPORT daemon, full, every time.
            s.bind((self.source, 0))
            code = s.connect_ex(self.addr)
        except OSError as exc:
            code = exc.errno
        if code not in (0, errno.EINPROGRESS):
            s.close()
            self.retry(slot, failed=True)
            return
        fd = s.detach()
        self.fd[slot], self.phase[slot], self.started[slot] = fd, CONNECTING, time.monotonic()
        self.slot_of[fd] = slot
        self.in_flight.add(slot)
        self.epoll.register(fd, select.EPOLLOUT)

    def drop(self, slot: int) -> None:
        fd = self.fd[slot]
        if fd >= 0:
            self.slot_of.pop(fd, None)
            os.close(fd)  # also leaves the epoll set
        if self.phase[slot] == OPEN:
            self.open -= 1
        self.fd[slot], self.phase[slot] = -1, IDLE
        self.partial.pop(slot, None)
        self.in_flight.discard(slot)

    def retry(self, slot: int, failed: bool = False, first: float | None = None) -> None:
        """Back to the queue after a backoff (``first``: the delay after a close, before any backoff)."""
        self.drop(slot)
        self.failed += failed
        attempt = self.attempt[slot]
        self.attempt[slot] = min(attempt + 1, 10)
        delay = first if first is not None else backoff(attempt, self.rng)
        heapq.heappush(self.due, (time.monotonic() + delay, slot))

    def writable(self, slot: int, fd: int) -> None:
        if self.phase[slot] != CONNECTING:
            return
        s = socket.socket(fileno=fd)
        error = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        s.detach()
        if error:
            self.retry(slot, failed=True)
            return
        token = mint(self.secret, self.user(slot), TOKEN_TTL)
        try:
            os.write(fd, request(self.host, self.port, token, self.since[slot]))
        except OSError:
            self.retry(slot, failed=True)
            return
        self.phase[slot] = HANDSHAKE
        self.epoll.modify(fd, select.EPOLLIN)

    def readable(self, slot: int, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.retry(slot, failed=self.phase[slot] != OPEN)
            return
        buf = self.partial.pop(slot, b"") + data
        if self.phase[slot] == HANDSHAKE:
            status, buf = head_status(buf)
            if status is None:
                self.partial[slot] = buf
                return
            if status != 101:  # 503: this daemon is full, starting or draining
                self.refused += 1
                self.retry(slot)
                return
            self.phase[slot] = UPGRADED
        frames, rest, _open = split_messages(buf, None)  # the daemon never fragments
        for opcode, payload in frames:
            if opcode == 1:
                self.text(slot, payload)
            elif opcode == 9:
                os.write(fd, masked(0xA, payload) if payload else PONG_EMPTY)
            elif opcode == 8:
                self.closed += 1
                try:
                    os.write(fd, CLOSE_REPLY)
                except OSError:
                    pass
                self.attempt[slot] = 0
                self.retry(slot, first=self.rng.uniform(0.0, 0.5))
                return
        if rest:
            self.partial[slot] = rest

    def text(self, slot: int, payload: bytes) -> None:
        doc = orjson.loads(payload)
        if doc.get("type") == "hello":
            if self.since[slot] == NO_SINCE or not doc["recovered"]:
                self.since[slot] = int(doc["cursor"])
            self.phase[slot], self.attempt[slot] = OPEN, 0
            self.in_flight.discard(slot)
            self.open += 1
            self.hellos += 1
            if self.mark is not None:
                self.back += 1
                self.last_back = time.time()
            return
        msg_id = int(doc["id"])
        self.got_slot.append(slot)
        self.got_id.append(msg_id)
        self.since[slot] = msg_id

    def expire_handshakes(self) -> None:
        now = time.monotonic()
        for slot in [s for s in self.in_flight if now - self.started[s] > HANDSHAKE_TIMEOUT]:
            self.timeouts += 1
            self.retry(slot, failed=True)

    def status(self) -> dict:
        return {"open": self.open, "target": self.target, "failed": self.failed, "refused": self.refused,
                "closed": self.closed, "hellos": self.hellos, "received": len(self.got_id), "back": self.back,
                "last_back": self.last_back, "pss_kb": pss_kb(), "waiting": len(self.due) + len(self.in_flight),
                "timeouts": self.timeouts, "in_flight": [sum(1 for s in self.in_flight if self.phase[s] == p)
                                                         for p in (CONNECTING, HANDSHAKE, UPGRADED)]}

    def command(self, line: bytes) -> str | None:
        cmd = orjson.loads(line)
        if "target" in cmd:
            self.grow(cmd["target"])
        if "mark" in cmd:
            self.mark, self.back, self.last_back = cmd["mark"], 0, 0.0
        return cmd.get("stop")

    def run(self) -> None:
        stdin = sys.stdin.buffer.fileno()
        os.set_blocking(stdin, False)
        self.epoll.register(stdin, select.EPOLLIN)
        pending = b""
        next_status = 0.0
        stop_path = None
        while stop_path is None:
            self.start_due()
            timeout = 0.05 if self.due else 0.5
            for fd, events in self.epoll.poll(timeout, 1024):
                if fd == stdin:
                    chunk = os.read(stdin, 65536)
                    if not chunk:  # the driver is gone: stop
                        stop_path = ""
                        break
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        stop_path = self.command(line) if stop_path is None else stop_path
                    continue
                slot = self.slot_of.get(fd)
                if slot is None:
                    continue
                if events & select.EPOLLOUT:
                    self.writable(slot, fd)
                else:
                    self.readable(slot, fd)
            now = time.monotonic()
            if now >= next_status:
                next_status = now + 1.0
                self.expire_handshakes()
                try:
                    print(orjson.dumps(self.status()).decode(), flush=True)
                except BrokenPipeError:  # the driver is gone: stop
                    stop_path = ""
        if stop_path:
            with open(stop_path, "wb") as f:
                f.write(orjson.dumps({"slots": self.got_slot.tolist(), "ids": self.got_id.tolist(),
                                      **self.status()}))
        with contextlib.suppress(BrokenPipeError):  # the driver may be gone
            print(orjson.dumps({"done": True, **self.status()}).decode(), flush=True)


def main() -> None:
    prefix, size, host, port, source = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    Clients(prefix, size, host, port, source, os.environ["CHAT_JWT_SECRET"]).run()


if __name__ == "__main__":
    main()
