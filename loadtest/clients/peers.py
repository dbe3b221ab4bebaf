"""One load-client program for our daemons and for Centrifugo, so that a
comparison measures the servers, not two different clients.

A process holds its share of the clients on one source address. Everything
but the few bytes of each protocol is the same code: the raw asyncio
protocol, a lean frame parser (``split_messages``), one orjson
parse per frame, and the accounting: every message id is for exactly one
user, and each of the user's devices gets them in id order, so a device keeps
only its last id and counts one at or below it as a repeat; a process keeps
each first arrival's id and latency,
from the wall-clock time the feed put in it (before the server's hop) to the
frame's arrival.

- ours: ``GET /v1/ws`` with ``Authorization`` (and ``?since=`` on a reconnect); a hello,
  then a frame per message whose ``body`` starts with the feed's time.
- Centrifugo: ``GET /connection/websocket``, then the connect command; its
  memory engine subscribes the user to the personal channel ``#user``; each
  publication's ``data`` carries ``id`` and ``t``. A server ping (``{}``) is
  answered with ``{}``.

A connection that closes is opened again after a jittered back-off, ours with
the last cursor (our contract: nothing is lost), Centrifugo's plainly (its
memory engine keeps no history to recover from).
"""

from __future__ import annotations

import asyncio
import random
import resource
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import orjson
import uvloop
from websockets.frames import Frame, Opcode

from chat import auth
from chatctl.client import Inbox
from loadtest.clients import centrifugo
from loadtest.clients.websocket import Fragments, Handshake, split_messages, upgrade_request

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

HANDSHAKES_IN_FLIGHT = 200  # under somaxconn (4096), across the processes


@dataclass
class PeersJob:
    kind: str  # "ours" | "centrifugo"
    users: list[str]
    host: str
    port: int
    secret: str
    source: str
    out: str


class PeerDevice:
    """One connection's user and what it has had, across its reconnects: a user's messages come
    in id order on every device (one stream per user, resumed after the last), so an id at or
    below the last one is a repeat."""

    __slots__ = ("user", "last", "inbox")

    def __init__(self, user: str):
        self.user = user
        self.last = 0
        self.inbox = Inbox()  # ours: the resume cursor


class ArrivalTally:
    """What one process received: each first arrival's id and latency, and repeats."""

    def __init__(self) -> None:
        self.ids = array("q")
        self.latency_ms = array("f")
        self.duplicates = 0
        self.frames = 0

    def record(self, device: PeerDevice, msg_id: int, sent: float, now: float) -> None:
        self.frames += 1
        if msg_id <= device.last:
            self.duplicates += 1
            return
        device.last = msg_id
        self.ids.append(msg_id)
        self.latency_ms.append((now - sent) * 1000)


class PeerClient(asyncio.Protocol):
    __slots__ = ("job", "device", "tally", "transport", "handshake", "buf", "partial", "opened", "lost", "close_code")
    transport: asyncio.Transport  # set by connection_made, which asyncio calls before anything else

    def __init__(self, job: PeersJob, device: PeerDevice, tally: ArrivalTally):
        self.job, self.device, self.tally = job, device, tally
        self.handshake = Handshake()
        self.buf = b""
        self.partial: Fragments | None = None
        loop = asyncio.get_running_loop()
        self.opened = loop.create_future()
        self.lost = loop.create_future()
        self.close_code: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream socket's: it reads and writes

    def data_received(self, data: bytes) -> None:
        if self.handshake.status != 101:
            data = self.handshake.read(data)
            if self.handshake.refused:
                self._settle(False)
                self.transport.close()
            elif self.handshake.status == 101 and self.job.kind == "centrifugo":
                self._send_text(centrifugo.connect_command(centrifugo.token(self.job.secret, self.device.user)))
        if not data:
            return
        now = time.time()
        messages, self.buf, self.partial = split_messages(self.buf + data if self.buf else data, self.partial)
        for opcode, payload in messages:
            if opcode == 0x1:
                self._text(payload, now)
            elif opcode == 0x9:
                self.transport.write(Frame(Opcode.PONG, payload).serialize(mask=True))
            elif opcode == 0x8:
                self.close_code = int.from_bytes(payload[:2], "big") if payload else 1005
                self.transport.close()

    def _text(self, payload: bytes, now: float) -> None:
        if self.job.kind == "ours":
            doc = orjson.loads(payload)
            if doc.get("type") == "hello":
                self.device.inbox.accept(doc)
                self._settle(True)
            elif "id" in doc:
                self.device.inbox.since = doc.get("cursor", doc["id"])
                self.tally.record(self.device, int(doc["id"]), float(doc["body"].split(" ", 1)[0]), now)
            return
        pubs, ping, connected = centrifugo.parse_frame(payload)
        if connected is not None:
            self._settle(connected)
        if ping:
            self._send_text(b"{}")
        for data in pubs:
            self.tally.record(self.device, int(data["id"]), float(data["t"]), now)

    def _send_text(self, payload: bytes) -> None:
        self.transport.write(Frame(Opcode.TEXT, payload).serialize(mask=True))

    def connection_lost(self, exc: Exception | None) -> None:
        self._settle(False)
        if not self.lost.done():
            self.lost.set_result(None)

    def _settle(self, ok: bool) -> None:
        if not self.opened.done():
            self.opened.set_result(ok)


def request(job: PeersJob, device: PeerDevice) -> bytes:
    if job.kind == "ours":
        since = device.inbox.since
        path = f"/v1/ws?since={since}" if since else "/v1/ws"
        credential = f"Authorization: Bearer {auth.mint(job.secret, device.user, 7200)}\r\n"
    else:
        path, credential = "/connection/websocket", ""
    return upgrade_request(job.host, job.port, path, credential)


async def run_clients(job: PeersJob, connected: Synchronized[int], frames: Synchronized[int], stop: Event) -> None:
    """Holds every user's connection until ``stop``; writes the tally to ``job.out``."""
    tally = ArrivalTally()
    gate = asyncio.Semaphore(HANDSHAKES_IN_FLIGHT)
    loop = asyncio.get_running_loop()
    reconnects, failures = 0, 0
    close_codes: dict[str, int] = {}
    rng = random.Random(job.source)

    async def hold(user: str) -> None:
        nonlocal reconnects, failures
        device = PeerDevice(user)
        attempt, first = 0, True
        while True:
            try:
                async with gate:
                    _, client = await loop.create_connection(lambda: PeerClient(job, device, tally), job.host,
                                                             job.port, local_addr=(job.source, 0))
                    client.transport.write(request(job, device))
                    ok = await asyncio.wait_for(client.opened, 30)
                if not ok:
                    client.transport.abort()
                    raise ConnectionError("refused")
            except (OSError, ConnectionError, TimeoutError):
                attempt += 1
                failures += 1
                await asyncio.sleep(min(5.0, 0.2 * 2 ** attempt) * rng.uniform(0.5, 1.5))
                continue
            if first:
                with connected.get_lock():
                    connected.value += 1
                first = False
            attempt = 0
            await client.lost
            code = str(client.close_code)
            close_codes[code] = close_codes.get(code, 0) + 1
            reconnects += 1
            await asyncio.sleep(rng.uniform(0.1, 1.0))  # jittered: a closed daemon's clients do not return at once

    tasks = [asyncio.create_task(hold(u)) for u in job.users]
    counted = 0
    while not stop.is_set():
        await asyncio.sleep(0.1)
        if tally.frames != counted:  # one lock per tick, not per frame
            with frames.get_lock():
                frames.value += tally.frames - counted
            counted = tally.frames
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    base = Path(job.out)
    base.with_suffix(".ids").write_bytes(tally.ids.tobytes())
    base.with_suffix(".lat").write_bytes(tally.latency_ms.tobytes())
    base.write_bytes(orjson.dumps({"duplicates": tally.duplicates, "frames": tally.frames, "reconnects": reconnects,
                                   "connect_failures": failures, "close_codes": close_codes}))


def client_proc(job: PeersJob, connected: Synchronized[int], frames: Synchronized[int], stop: Event) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(run_clients(job, connected, frames, stop))


def read_tally(out: str) -> tuple[dict, array, array]:
    base = Path(out)
    ids, lat = array("q"), array("f")
    ids.frombytes(base.with_suffix(".ids").read_bytes())
    lat.frombytes(base.with_suffix(".lat").read_bytes())
    return orjson.loads(base.read_bytes()), ids, lat
