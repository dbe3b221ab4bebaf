"""Private MariaDB, FerretDB and Redis instances on free ports, for tests and benchmarks.

Each instance lives in its own folder and is stopped (and its folder left for
post-mortems) when the context exits. Nothing here is a fake: these are the
real servers that `make run` starts under supervisord.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.waiting import FACTOR, eventually_sync

ROOT = Path(__file__).resolve().parent.parent
FERRETDB = ROOT / ".cache/ferretdb/bin/ferretdb"


# Ports handed out below the kernel's ephemeral range (32768-60999 by
# default), so that no outgoing connection can take a port between the moment
# it is chosen and the moment its server binds it. Each pytest-xdist worker
# counts through a range of its own, so two workers never choose the same one;
# the count starts at a random place, for two runs side by side.
_PORTS_PER_WORKER = 2_000
_worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
_FIRST_PORT = 20_000 + (int(_worker) if _worker.isdigit() else 0) % 6 * _PORTS_PER_WORKER
_offset = random.randrange(_PORTS_PER_WORKER)


def free_port() -> int:
    """A port nothing is bound to, for a server about to start."""
    global _offset
    for _ in range(_PORTS_PER_WORKER):
        port = _FIRST_PORT + _offset
        _offset = (_offset + 1) % _PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port in {_FIRST_PORT}-{_FIRST_PORT + _PORTS_PER_WORKER - 1}")


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None, host: str = "127.0.0.1") -> None:
    """Until a connection to the port is taken; ``timeout`` in seconds at CHAT_TESTS_TIMEOUT_FACTOR 1."""
    def listening() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
            return True
        return False

    eventually_sync(listening, f"something listens on {host}:{port}", timeout * FACTOR)


def wait_unix_socket(path: Path, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Until a connection to the Unix socket at ``path`` is taken. mariadbd listens on its TCP
    port before it binds and listens on its socket, so a client that connects through the socket
    as soon as the port answers can be refused (errno 111): the cluster's start was, once."""
    def listening() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {path}")
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.2)
            sock.connect(str(path))
            return True
        return False

    eventually_sync(listening, f"something listens on {path}", timeout * FACTOR)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class MariaDB:
    dir: Path
    port: int
    proc: subprocess.Popen | None = None

    @property
    def socket(self) -> Path:
        return self.dir / "mysqld.sock"

    def url(self, database: str = "chat") -> str:
        return f"mysql+mysqldb://root@localhost/{database}?unix_socket={self.socket}&charset=utf8mb4"

    @property
    def tmpdir(self) -> Path:
        # Its own: a starting mariadbd deletes every #sql* file in its tmpdir,
        # which in a shared /tmp are the live temporary tables of a server that
        # another test worker is initialising at that moment.
        return self.dir / "tmp"

    def start(self) -> None:
        data = self.dir / "data"
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        if not data.exists():
            made = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                                   "--auth-root-authentication-method=normal", "--skip-test-db",
                                   f"--tmpdir={self.tmpdir}"],
                                  capture_output=True, text=True)
            if made.returncode != 0:  # say why: its output is the only record
                raise RuntimeError(f"mariadb-install-db exited {made.returncode}:\n{made.stdout}\n{made.stderr}")
        log = open(self.dir / "mariadb.log", "ab")
        self.proc = subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={self.socket}", f"--port={self.port}",
             f"--tmpdir={self.tmpdir}", "--bind-address=127.0.0.1", "--user=root", "--skip-log-bin",
             "--innodb-buffer-pool-size=128M", "--max-connections=500", f"--pid-file={self.dir / 'mariadb.pid'}"],
            stdout=log, stderr=log)
        wait_port(self.port, 60, self.proc)
        wait_unix_socket(self.socket, 60, self.proc)  # root connects through it

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc:
            stop(self.proc, sig)


@dataclass
class FerretDB:
    dir: Path
    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def start(self) -> None:
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "ferretdb.log", "ab")
        self.proc = subprocess.Popen(ferretdb_command(data, self.port), stdout=log, stderr=log,
                                     env={**os.environ, **FERRETDB_GC})
        wait_port(self.port, 30, self.proc)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc:
            stop(self.proc, sig)


# Go's collector ran a sixth of FerretDB's CPU under load (pprof: mark workers
# and assists, at 1,000 msg/s), for a live heap of a few tens of MB. Collecting
# when the heap has grown 16-fold instead of 2-fold took delivery p50 from
# 181-195 ms to 125 ms (100 WebSocket clients, 1,000 msg/s; docs/decisions/ferretdb-gc.md)
# for about 175 MB of RSS; the soft limit keeps a big fill's heap in check.
# scripts/ferretdb.sh sets the same for `make run` (a test holds them equal).
FERRETDB_GC = {"GOGC": "1600", "GOMEMLIMIT": "1GiB"}


def ferretdb_command(data: Path, port: int) -> list[str]:
    # Flags (docs/ferretdb.md): no debug port (a second instance would
    # clash on 8088), state beside the data, fast capped-collection cleanup
    # so the small oplog stays small.
    return [str(FERRETDB), "--handler=sqlite", f"--sqlite-url=file:{data}/", f"--listen-addr=127.0.0.1:{port}",
            "--repl-set-name=rs0", "--telemetry=disable", "--log-level=warn", "--debug-addr=-",
            f"--state-dir={data}", "--test-capped-cleanup-interval=200ms"]


@dataclass
class Redis:
    """The signals' carrier (docs/presence.md): nothing in it is kept, so no snapshot and no append log."""
    dir: Path
    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)], stdout=log, stderr=log)
        wait_port(self.port, 20, self.proc)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc:
            stop(self.proc, sig)


@contextlib.contextmanager
def running(server: MariaDB | FerretDB | Redis) -> Iterator:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def fresh_dir(base: Path, name: str) -> Path:
    path = base / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def env_for(mariadb: MariaDB, ferretdb: FerretDB, redis: Redis | None = None, **extra: str) -> dict[str, str]:
    """The processes' environment; without ``redis``, no typing or presence (and no connection to
    the default Redis URL, which may be another run's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAT_")}
    # URL tokens on: many tests' raw clients and Autobahn's wstest (which can set no
    # header) put the token in the URL. The default refuses them: the tests of
    # that default, the web client's and chatctl's set it to false.
    env.update({"CHAT_MYSQL_URL": mariadb.url(), "CHAT_MONGO_URL": ferretdb.url,
                "CHAT_JWT_SECRET": "test-secret-0123456789abcdef0123456789", "CHAT_URL_TOKENS_ALLOWED": "true",
                "CHAT_REDIS_URL": redis.url if redis is not None else ""})
    env.update(extra)
    return env
