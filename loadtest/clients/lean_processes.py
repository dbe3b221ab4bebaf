"""Lean WebSocket clients (``loadtest.clients.lean``) in processes of their own, as the
benchmarks that run thousands of them on the same cores as the system use them.

In a client process: the body that holds as many sockets as the open-files limit
allows, the connection tried again through a gate of handshakes in flight, the
shared counters, and the end (every socket dropped, the result file written).
In the main process: the processes started, the wait until their connections
are held with the daemons' memory sampled on the way (memory per connection),
their end and their result files.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import resource
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson
import uvloop

from chatctl.client import Inbox
from loadtest import wsload
from loadtest.clients import lean as leanclient

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event

CONNECT_TRIES = 5
HELD_SETTLE_SECONDS = 3.0  # after the last connection, before the daemons' memory is read: their buffers settle


class WritesResult(Protocol):
    out: str  # the result file the client process writes at its end


JobT = TypeVar("JobT", bound=WritesResult)
SharedT = TypeVar("SharedT")


@dataclass
class LeanJob:
    """One client process's share of the users (one client each) and where they connect."""
    users: list[str]
    host: str
    port: int
    secret: str
    source: str
    out: str


def ws_host_port(ws_url: str) -> tuple[str, int]:
    host, port = ws_url.removeprefix("ws://").rsplit(":", 1)
    return host, int(port)


def source_address(k: int) -> str:
    """Client process ``k``'s own loopback address: each address has its own ephemeral ports,
    so tens of thousands of connections to one daemon port do not run out of them."""
    return f"127.0.0.{2 + k}"


def jobs(users: list[str], processes: int, ws_url: str, secret: str, tmp: Path) -> list[LeanJob]:
    """The users dealt out to ``processes`` client processes, each with its result file in ``tmp``."""
    host, port = ws_host_port(ws_url)
    return [LeanJob(users[k::processes], host, port, secret, source_address(k), str(tmp / f"c{k}.json"))
            for k in range(processes)]


# --- in a client process ------------------------------------------------------------------------


def client_process(clients: Callable[[JobT, SharedT], Coroutine[Any, Any, None]], job: JobT, shared: SharedT) -> None:
    """A client process's body: ``clients(job, shared)`` on uvloop. One socket per client: the
    soft open-files limit (1,024) is raised to the hard one."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(clients(job, shared))


async def connect_retrying(gate: asyncio.Semaphore, host: str, port: int, token: str, inbox: Inbox,
                           on_frame: Callable[[dict, float], None], source: str,
                           query: str = "") -> leanclient.LeanClient | None:
    """A client connected, its handshake within ``gate`` (handshakes in flight: the listen queue
    holds so many), tried again after a longer pause each time; None once every try failed."""
    for attempt in range(CONNECT_TRIES):
        try:
            async with gate:
                return await leanclient.connect(host, port, token, inbox, on_frame, source=source, query=query)
        except (OSError, ConnectionError):
            await asyncio.sleep(0.2 * (attempt + 1))
    return None


def count(counter: Synchronized[int], n: int = 1) -> None:
    with counter.get_lock():
        counter.value += n


async def close_and_write(out: str, inboxes: dict[str, Inbox], clients: dict[str, leanclient.LeanClient],
                          tasks: list[asyncio.Task], failures: int, **figures: object) -> None:
    """A client process's end: every task cancelled, every socket dropped, and its result file:
    what each user received (and the duplicates the inboxes dropped), ``figures``, the clients
    that never connected, and the connections the server closed (those lost before ours were
    dropped) with their close codes."""
    closed = [c.closed_code for c in clients.values() if c.lost.done()]
    for t in tasks:
        t.cancel()
    for c in clients.values():
        c.transport.abort()
    await asyncio.gather(*tasks, return_exceptions=True)
    Path(out).write_bytes(orjson.dumps({
        "received": {u: box.ids for u, box in inboxes.items()},
        "duplicates": sum(box.duplicates for box in inboxes.values()),
        **figures, "failures": failures,
        "closed": len(closed), "close_codes": sorted({c for c in closed if c is not None})}))


# --- in the main process ------------------------------------------------------------------------


class ClientProcesses:
    """The client processes of a run, ``clients(job, shared)`` in each: started, stopped
    through ``stop``, and their result files read."""

    def __init__(self, clients: Callable[[JobT, SharedT], Coroutine[Any, Any, None]], jobs: Sequence[JobT],
                 shared: SharedT, stop: Event) -> None:
        ctx = mp.get_context("spawn")  # the context the shared counters were made in
        self.procs: list[BaseProcess] = [ctx.Process(target=client_process, args=(clients, job, shared), daemon=True)
                                         for job in jobs]
        self.outs = [job.out for job in jobs]
        self.stop_event = stop

    def start(self) -> None:
        for p in self.procs:
            p.start()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def stop(self) -> None:
        """Each process told to end and waited for (its result file is written on the way out)."""
        self.stop_event.set()
        for p in self.procs:
            p.join(120)
            if p.is_alive():
                p.kill()

    def results(self) -> list[dict]:
        return [orjson.loads(Path(out).read_bytes()) for out in self.outs]


def wait_connected(connected: Synchronized[int], want: int,
                   daemon_pids: list[int] | None = None) -> tuple[int, float, tuple[int, int] | None]:
    """Until ``want`` clients hold their connection, at most 60 s and a second per 200 more;
    (held, seconds, (connections, the daemons' PSS) once half of them were held, with ``daemon_pids``)."""
    from loadtest.million.scenario import pss  # not at the top: the client processes import this module

    started = time.monotonic()
    half: tuple[int, int] | None = None
    while connected.value < want and time.monotonic() - started < 60 + want / 200:
        time.sleep(0.2)
        if daemon_pids and half is None and (n := connected.value) >= want // 2:
            half = (n, pss(daemon_pids))
    return connected.value, time.monotonic() - started, half


def wait_quiet(frames: Synchronized[int], messages: Synchronized[int], want_messages: int, quiet: float,
               limit: float) -> float:
    """Until the clients hold ``want_messages`` message frames and no frame came for ``quiet`` s
    (what answers a message follows it), at most ``limit`` s; the seconds waited."""
    started = time.monotonic()
    last, still = frames.value, time.monotonic()
    while time.monotonic() - started < limit:
        time.sleep(0.1)
        now = frames.value
        if now != last:
            last, still = now, time.monotonic()
        elif messages.value >= want_messages and time.monotonic() - still >= quiet:
            break
    return time.monotonic() - started


def daemon_memory(pids: list[int]) -> tuple[int, int]:
    """(PSS, RSS) of the processes, bytes."""
    from loadtest.million.scenario import pss

    return pss(pids), wsload._rss(pids)


def kb_per_connection(before: int, after: int, held: int) -> float:
    return round((after - before) / max(1, held) / 1024, 2)


@dataclass
class Held:
    """Connections held, and the memory they took: the daemons' (PSS, RSS) before the first one
    and once the last one settled, their PSS once half were held, the client processes' PSS."""
    clients: int
    held: int
    seconds: float
    client_procs: int
    idle: tuple[int, int]
    half: tuple[int, int] | None
    settled: tuple[int, int]
    client_pss: int

    def pss_kb_per_conn(self) -> float:
        return kb_per_connection(self.idle[0], self.settled[0], self.held)

    def figures(self) -> dict:
        """The connections and the memory per connection, as the results report them."""
        half, held = self.half, self.held
        return {
            "clients": self.clients, "held": held, "connect_seconds": round(self.seconds, 1),
            "client_procs": self.client_procs,
            "pss_kb_per_conn": self.pss_kb_per_conn(),
            "rss_kb_per_conn": kb_per_connection(self.idle[1], self.settled[1], held),
            "pss_kb_per_conn_second_half": kb_per_connection(half[1], self.settled[0], held - half[0])
            if half and held > half[0] else None,
            "daemon_pss_mb_idle": round(self.settled[0] / 2**20, 1),
            "client_pss_kb_per_conn": round(self.client_pss / held / 1024, 2) if held else None}

    def line(self) -> str:
        return (f"{self.held}/{self.clients} connected in {self.seconds:.1f} s; daemons' PSS "
                f"{self.pss_kb_per_conn()} KB per connection")


def hold_connections(processes: ClientProcesses, connected: Synchronized[int], clients: int,
                     daemon_pids: list[int]) -> Held:
    """The client processes started and waited for until their ``clients`` connections are
    held, with the daemons' memory read before, at half and once they settled."""
    from loadtest.million.scenario import pss

    time.sleep(1.0)  # the daemons' start-up is over before their idle figure
    idle = daemon_memory(daemon_pids)
    processes.start()
    held, seconds, half = wait_connected(connected, clients, daemon_pids)
    time.sleep(HELD_SETTLE_SECONDS)
    settled = daemon_memory(daemon_pids)
    return Held(clients, held, seconds, len(processes.procs), idle, half, settled, pss(processes.pids()))
