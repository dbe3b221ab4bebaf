"""What nginx's passive health check settings do to WebSocket clients: how long they take to be
back after every daemon restarts at once, and what one silent daemon host costs a handshake.

`python -m loadtest.proxy_restart [--clients 400] [--daemons 6] [--budget 60]`: the edge's
nginx.conf as `make cluster` generates it (cluster/nginx_conf.py), in front of ``daemons``
stand-in daemons: WebSocket servers in this process that answer each handshake with a hello
frame. ``clients`` clients connect through nginx, without ``?partition=`` (every daemon's
upstream), and reconnect after a close or a refused handshake with the web client's backoff
(0.3 s doubling to 10 s, full jitter in [cap/2, cap]: api/static/connection-rules.js). Then
every daemon closes its sockets with 1012 and stops listening for ``down`` seconds, as a
restart of each does. For each setting of the daemons' ``server`` lines, on a fresh nginx:
the handshakes nginx refused and with what status, and the seconds from the restart until
every client had its hello again, or how many had it when ``budget`` seconds had passed.

Then, on a fresh nginx, one of the daemons is silent: a listener that never accepts and whose
queue is full, so that a connect to it gets no answer, as to a host that was switched off
(a killed process gets a refusal at once instead). ``clients`` // 4 clients hold sockets
(least_conn then ranks the silent peer, which holds none, first), and ``probes`` new clients
connect one after the other: how long each handshake took.

What it measures is nginx, not the daemons: a stand-in accepts as fast as the kernel does.
Writes ``loadtest/results/proxy-restart-latest.json`` (``--out``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import typer
import websockets
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import InvalidStatus

from cluster import nginx_conf
from cluster.partitions import ClusterDaemon
from harness.servers import free_port, stop, wait_port
from loadtest.common import machine
from loadtest.common.results import RESULTS

app = typer.Typer(add_completion=False)

NGINX = "/usr/sbin/nginx"
# The daemons' server parameters measured: before (the cluster's, then deploy/nginx/chat.conf's) and now.
SETTINGS = ("max_fails=1 fail_timeout=10s", "max_fails=3 fail_timeout=10s", nginx_conf.DAEMON_SERVER)
HELLO = orjson.dumps({"type": "hello", "cursor": "0", "recovered": True}).decode()


def log(msg: str) -> None:
    print(f"[proxy-restart] {msg}", flush=True)


def backoff(attempt: int, base: float = 0.3, cap: float = 10.0) -> float:
    """The web client's delay before attempt ``attempt`` (connection-rules.js backoffDelay)."""
    top = min(cap, base * 2 ** max(0, attempt - 1))
    return top / 2 + random.random() * top / 2


class StandIn:
    """A daemon stand-in on a port: a hello to every client; a restart closes every socket
    with 1012 and refuses connections until it listens again."""

    def __init__(self, port: int):
        self.port = port
        self.server: Server | None = None
        self.connections: set[ServerConnection] = set()

    async def handler(self, ws: ServerConnection) -> None:
        self.connections.add(ws)
        try:
            await ws.send(HELLO)
            await ws.wait_closed()
        finally:
            self.connections.discard(ws)

    async def start(self) -> None:
        self.server = await serve(self.handler, "127.0.0.1", self.port, ping_interval=None)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close(close_connections=False)  # no new connection: refused, as by a process gone
        await asyncio.gather(*(ws.close(1012, "restarting") for ws in list(self.connections)))
        await self.server.wait_closed()


@dataclass
class RestartTally:
    clients: int
    connected: set[int] = field(default_factory=set)
    restarted_at: float | None = None
    back_at: dict[int, float] = field(default_factory=dict)  # client -> its first hello after the restart
    refused: Counter[int] = field(default_factory=Counter)  # status -> handshakes nginx refused after the restart
    errors: int = 0  # no answer at all from nginx (never expected)


async def keep_connected(url: str, i: int, tally: RestartTally) -> None:
    attempt = 0
    while True:
        try:
            async with websockets.connect(url, open_timeout=30, ping_interval=None) as ws:
                await ws.recv()  # the hello
                attempt = 0
                tally.connected.add(i)
                if tally.restarted_at is not None:
                    tally.back_at.setdefault(i, time.monotonic())
                await ws.wait_closed()
        except InvalidStatus as refused:
            if tally.restarted_at is not None:
                tally.refused[refused.response.status_code] += 1
        except (OSError, TimeoutError, websockets.ConnectionClosed):
            if tally.restarted_at is not None:
                tally.errors += 1
        attempt += 1
        await asyncio.sleep(backoff(attempt))


def silent_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A port that takes no connection and refuses none: its accept queue (of 1) is full and
    the kernel drops every SYN, as a host that is gone answers nothing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_port()))
    listener.listen(0)
    queued = socket.create_connection(listener.getsockname())
    return listener, [queued]


async def until(done: Callable[[], bool], budget: float) -> None:
    """Polls ``done()`` every 50 ms, ``budget`` seconds at most (a measurement, not a test)."""
    deadline = time.monotonic() + budget
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def edge(daemon_ports: list[int], daemon_server: str) -> Iterator[str]:
    """nginx with the cluster's generated config; yields its ws:// URL of /v1/ws."""
    root = Path(tempfile.mkdtemp(prefix="proxy-restart-"))
    port = free_port()
    daemons = [ClusterDaemon("local", "127.0.0.1", i, p, (0,)) for i, p in enumerate(daemon_ports)]
    conf = root / "nginx.conf"
    conf.write_text(nginx_conf.render(f"127.0.0.1:{port}", [f"127.0.0.1:{free_port()}"], daemons, 1,
                                      nginx_conf.EdgePaths(root), worker_connections=4096,
                                      daemon_server=daemon_server))
    with open(root / "nginx.out", "ab") as out:
        proc = subprocess.Popen([NGINX, "-p", str(root), "-c", str(conf)], stdout=out, stderr=out)
        try:
            wait_port(port, 10, proc)
            yield f"ws://127.0.0.1:{port}/v1/ws"
        finally:
            stop(proc)


async def measure_restart(daemon_server: str, clients: int, daemons: int, down: float, budget: float) -> dict:
    stand_ins = [StandIn(free_port()) for _ in range(daemons)]
    for s in stand_ins:
        await s.start()
    tally = RestartTally(clients)
    with edge([s.port for s in stand_ins], daemon_server) as url:
        tasks = [asyncio.create_task(keep_connected(url, i, tally)) for i in range(clients)]
        await until(lambda: len(tally.connected) == clients, budget)
        assert len(tally.connected) == clients, f"{len(tally.connected)} of {clients} connected before the restart"
        tally.restarted_at = time.monotonic()
        await asyncio.gather(*(s.stop() for s in stand_ins))
        await asyncio.sleep(down)  # the restart: nothing listens
        for s in stand_ins:
            await s.start()
        await until(lambda: len(tally.back_at) == clients, budget)
        back = dict(tally.back_at)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for s in stand_ins:
        await s.stop()
    times = sorted(at - tally.restarted_at for at in back.values())
    return {
        "back": len(back), "of": clients,
        "all_back_seconds": round(times[-1], 1) if len(back) == clients else None,
        "half_back_seconds": round(times[clients // 2 - 1], 1) if len(back) >= clients // 2 else None,
        "refused": {str(k): v for k, v in sorted(tally.refused.items())}, "no_answer": tally.errors,
    }


async def measure_silent_peer(daemon_server: str, holders: int, daemons: int, probes: int) -> dict:
    stand_ins = [StandIn(free_port()) for _ in range(daemons - 1)]
    for s in stand_ins:
        await s.start()
    listener, queued = silent_listener()
    tally = RestartTally(holders)
    seconds: list[float] = []
    failed = 0
    try:
        with edge([s.port for s in stand_ins] + [listener.getsockname()[1]], daemon_server) as url:
            tasks = [asyncio.create_task(keep_connected(url, i, tally)) for i in range(holders)]
            await until(lambda: len(tally.connected) == holders, 60)
            for _ in range(probes):
                started = time.monotonic()
                try:
                    async with websockets.connect(url, open_timeout=30, ping_interval=None) as ws:
                        await ws.recv()
                except (InvalidStatus, OSError, TimeoutError, websockets.ConnectionClosed):
                    failed += 1
                seconds.append(time.monotonic() - started)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for sock in (listener, *queued):
            sock.close()
        for s in stand_ins:
            await s.stop()
    seconds.sort()
    return {"probes": probes, "failed": failed, "p50_ms": round(1000 * seconds[len(seconds) // 2 - 1]),
            "max_ms": round(1000 * seconds[-1]), "slower_than_100ms": sum(1 for t in seconds if t > 0.1)}


@app.command()
def main(clients: int = typer.Option(400, help="WebSocket clients through nginx."),
         daemons: int = typer.Option(6, help="Stand-in daemons, all in the upstream (the cluster's 3 hosts x 2)."),
         down: float = typer.Option(1.0, help="Seconds each daemon refuses connections during its restart."),
         budget: float = typer.Option(60.0, help="Seconds at most to wait for every client to be back, per setting."),
         probes: int = typer.Option(50, help="Handshakes, one after the other, with one daemon silent."),
         out: Path = typer.Option(RESULTS / "proxy-restart-latest.json")) -> None:
    rows = []
    for setting in SETTINGS:
        restart = asyncio.run(measure_restart(setting, clients, daemons, down, budget))
        log(f"{setting}: {restart['back']} of {clients} back, all in {restart['all_back_seconds']} s, "
            f"refused {restart['refused']}")
        silent = asyncio.run(measure_silent_peer(setting, clients // 4, daemons, probes))
        log(f"{setting}, one daemon silent: handshake p50 {silent['p50_ms']} ms, max {silent['max_ms']} ms, "
            f"{silent['slower_than_100ms']} of {probes} slower than 100 ms")
        rows.append({"daemon_server": setting, "restart": restart, "silent_peer": silent})
    result = {"what": "restart: every daemon behind nginx restarted at once: its clients' handshakes refused, and "
                      "the seconds until every client had its hello again (None: not within budget_seconds); "
                      "silent_peer: one daemon answering no connect, new handshakes one after the other",
              "machine": machine.describe(), "nginx": subprocess.run([NGINX, "-v"], capture_output=True,
                                                                       text=True).stderr.strip(),
              "clients": clients, "daemons": daemons, "down_seconds": down, "budget_seconds": budget,
              "daemon_connect_timeout": nginx_conf.DAEMON_CONNECT_TIMEOUT,
              "runs": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    log(f"-> {out}")


if __name__ == "__main__":
    app()
