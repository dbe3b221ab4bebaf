"""Traffic for the cluster bench: WebSocket devices that reconnect and resume
with ``since``, and a sender that posts one-to-one messages, all through the
edge's nginx.

Devices live in a client process of their own (spawned; leanclient sockets on
uvloop); each device keeps its own Inbox, so what is lost or repeated is
counted per device. The sender records every attempt (time, status, answer
time, the API host that answered), so the bench can cut a run into windows
and hosts after the fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import orjson
import uvloop

from chat import auth
from chatctl.client import Inbox
from loadtest.clients import lean as leanclient

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

SEND_CONNECTIONS = 256  # requests in flight: a stalled partition's 503s (2 s each) must not starve the others
RECONNECT_SECONDS = 60.0  # a device gives up reconnecting after this long without success


@dataclass
class ClientDevice:
    """One socket a client process holds: its user, which of the user's devices, its route."""

    user: str
    index: int  # of the user's devices
    partition: int | None  # the ?partition= it connects with; None: none


@dataclass
class ClientJob:
    devices: list[ClientDevice]
    host: str
    port: int
    secret: str
    out: str


def client_process(job: ClientJob, connected: Synchronized[int], frames: Synchronized[int], stop: Event) -> None:
    """Entry point of the spawned client process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(_devices(job, connected, frames, stop))


async def _devices(job: ClientJob, connected: Synchronized[int], frames: Synchronized[int], stop: Event) -> None:
    inboxes = [Inbox() for _ in job.devices]
    # first arrivals: [arrival time, latency s, the device's index, the message's sender]
    arrivals: list[list[float | int | str]] = []
    reconnects = failures = counted = relearned = 0
    gate = asyncio.Semaphore(100)  # handshakes in flight
    clients: list[leanclient.LeanClient | None] = [None] * len(job.devices)
    back_at: list[float | None] = [None] * len(job.devices)  # each device's latest reconnect (time.time())
    reloaded_at: list[int] = [0] * len(job.devices)  # frames it had when last told `recovered: false`

    # A message's key is its client_msg_id: the recipient of a message between
    # partitions receives a copy, whose id is a position in its own partition.
    keys: list[list[str]] = [[] for _ in job.devices]

    def on_frame(i: int, doc: dict, now: float) -> None:
        nonlocal counted
        keys[i].append(doc["client_msg_id"])
        arrivals.append([now, now - float(doc["body"].split(" ", 1)[0]), i, doc["from"]])
        counted += 1

    async def device(i: int, d: ClientDevice) -> None:
        nonlocal reconnects, failures, relearned
        token = auth.mint(job.secret, d.user, 7200)
        query = "" if d.partition is None else f"partition={d.partition}"
        first, gave_up_at = True, None
        while not stop.is_set():
            try:
                async with gate:
                    client = await leanclient.connect(job.host, job.port, token, inboxes[i],
                                                      lambda doc, now: on_frame(i, doc, now), timeout=10,
                                                      query=query)
            except (OSError, ConnectionError) as failed:
                if isinstance(failed, leanclient.HandshakeRefused) and failed.status == 421:
                    # its slot moved: the API says where it lives now, as a client asks it
                    with contextlib.suppress(OSError, aiohttp.ClientError, TimeoutError, KeyError, ValueError):
                        query = f"partition={await partition_of_user(job.host, job.port, token)}"
                        relearned += 1
                        continue
                gave_up_at = gave_up_at or time.monotonic()
                if time.monotonic() - gave_up_at > RECONNECT_SECONDS:
                    failures += 1
                    return
                await asyncio.sleep(random.uniform(0.2, 1.0))
                continue
            gave_up_at = None
            clients[i] = client
            if first:
                first = False
                with connected.get_lock():
                    connected.value += 1
            else:
                reconnects += 1
                back_at[i] = time.time()
                if not inboxes[i].hellos[-1]["recovered"]:  # told to reload history: what came before is superseded
                    reloaded_at[i] = len(keys[i])
            await client.lost
            await asyncio.sleep(random.uniform(0.05, 0.5))  # jitter: not every device of a dead host at once

    tasks = [asyncio.create_task(device(i, d)) for i, d in enumerate(job.devices)]
    while not stop.is_set():
        await asyncio.sleep(0.1)
        if counted:
            with frames.get_lock():
                frames.value += counted
            counted = 0
    for c in clients:
        if c is not None:  # a connected client: connect() returns once its transport is made
            c.transport.abort()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    Path(job.out).write_bytes(orjson.dumps({
        "received": keys, "duplicates": [box.duplicates for box in inboxes],
        "arrivals": arrivals, "reconnects": reconnects, "failures": failures, "relearned": relearned,
        "hellos": [[[h["recovered"], h["cursor"]] for h in box.hellos] for box in inboxes],
        "back_at": back_at, "reloaded_at": reloaded_at}))


async def partition_of_user(host: str, port: int, token: str) -> int:
    """The user's partition from ``GET /v1/client-config``, as a client learns it."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
            session.get(f"http://{host}:{port}/v1/client-config", headers={"Authorization": f"Bearer {token}"}) as r:
        return int((await r.json())["partition"])


@dataclass
class Attempt:
    at: float  # time.time() it was sent
    status: int  # 0: no answer (connection error, timeout)
    seconds: float
    upstream: str  # the API that answered (nginx's X-Chat-Upstream), "" if none
    error: str = ""  # a refusal's `error` (README, "Public contract"), "" otherwise


@dataclass
class Sent:
    sender: str
    recipient: str
    at: float
    key: str  # its client_msg_id: the same in the original and in a copy
    msg_id: int | None = None  # set once stored (201 or a replayed 200)
    attempts: list[Attempt] = field(default_factory=list)


async def send(url: str, secret: str, users: list[str], rate: float, seconds: float, seed: int = 1,
               tick: Callable[[int], None] | None = None, until: Callable[[], bool] | None = None,
               partition_of: Callable[[str], int | None] = lambda user: None) -> list[Sent]:
    """Posts ``rate`` messages/s for ``seconds`` between random pairs, each retried
    (the same client_msg_id) on 5xx or no answer for up to 5 attempts; the first
    with ``?partition=`` the sender's ``partition_of`` (None: none), the retries without, as a client sends them.
    ``tick(i)`` is called once a second with the messages scheduled so far.
    ``until()``, if given, ends the sending early once it says so (``seconds`` bounds it)"""
    rng = random.Random(seed)
    run_tag = secrets.token_hex(4)
    tokens: dict[str, str] = {}
    sent: list[Sent] = []
    connector = aiohttp.TCPConnector(limit=SEND_CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=20)) as session:
        gate = asyncio.Semaphore(SEND_CONNECTIONS)

        async def one(i: int, record: Sent) -> None:
            tok = tokens.get(record.sender) or tokens.setdefault(record.sender, auth.mint(secret, record.sender, 7200))
            headers = {"Authorization": f"Bearer {tok}", "Content-Type": "application/json"}
            body = orjson.dumps({"to": record.recipient, "body": f"{record.at:.6f} cluster",
                                 "client_msg_id": record.key})
            partition = partition_of(record.sender)
            for attempt in range(5):
                # A retry goes to any API: its leader may be the host that cannot store (its MySQL link cut)
                query = "" if partition is None or attempt else f"?partition={partition}"
                t0 = time.time()
                status, upstream, answer = 0, "", b""
                try:
                    async with gate, session.post(f"{url}/v1/messages{query}", data=body, headers=headers) as r:
                        answer = await r.read()
                        status = r.status
                        upstream = r.headers.get("X-Chat-Upstream", "").split(",")[-1].strip()
                except (aiohttp.ClientError, TimeoutError):
                    pass
                error = ""
                if status >= 400:
                    with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
                        error = str(orjson.loads(answer).get("error", ""))
                record.attempts.append(Attempt(t0, status, time.time() - t0, upstream, error))
                if status in (200, 201):
                    record.msg_id = int(orjson.loads(answer)["id"])
                    return
                if 400 <= status < 500 and status != 429:
                    return  # the generator's fault: a retry cannot help
                await asyncio.sleep(0.2 * (attempt + 1))

        start = time.monotonic()
        tasks = []
        total = int(rate * seconds)
        for i in range(total):
            if until is not None and until():  # what the run waited for happened: it ends before ``seconds``
                break
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            a, b = rng.sample(users, 2)
            record = Sent(a, b, time.time(), f"C{run_tag}-{i}")
            sent.append(record)
            tasks.append(asyncio.create_task(one(i, record)))
            if tick and i % max(1, int(rate)) == 0:
                tick(i)
        await asyncio.gather(*tasks)
    return sent
