"""The system under test as real processes: API and daemons on free ports,
talking to a private MariaDB and FerretDB. Used by the e2e tests and by the
benchmarks in loadtest/."""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from chat import auth
from chat.settings import Settings, StoresSettings
from db.init import init_all
from harness.servers import ROOT, FerretDB, MariaDB, Redis, env_for, free_port, fresh_dir, running, stop
from harness.waiting import FACTOR, eventually_sync


@dataclass
class Databases:
    mariadb: MariaDB
    ferretdb: FerretDB
    redis: Redis | None = None  # the signals' carrier: typing and presence

    def settings(self, **stores: Any) -> Settings:
        """Settings that reach these servers; ``stores``: more of ``settings.stores``."""
        stores.setdefault("redis_url", self.redis.url if self.redis is not None else "")
        return Settings(stores=StoresSettings(mysql_url=self.mariadb.url(), mongo_url=self.ferretdb.url, **stores))


@contextlib.contextmanager
def databases(base: Path, **init: object) -> Iterator[Databases]:
    """A MariaDB, a FerretDB and a Redis of their own, with the schema laid out.
    ``init``: `settings.stores` fields for `db.init` only (``oplog_max_docs=...``, ``partitions=...``).

    The data folders are copies of a template built once per process for each
    ``init``: ``mariadb-install-db`` and the migrations took several seconds
    per instance, a copy takes a fraction of one."""
    mariadb = MariaDB(fresh_dir(base, "mariadb"), free_port())
    ferretdb = FerretDB(fresh_dir(base, "ferretdb"), free_port())
    redis = Redis(fresh_dir(base, "redis"), free_port())
    template = _template(init)
    shutil.copytree(template / "mariadb", mariadb.dir / "data", symlinks=True)
    shutil.copytree(template / "ferretdb", ferretdb.dir / "data", symlinks=True)
    try:
        with running(mariadb), running(ferretdb), running(redis):
            yield Databases(mariadb, ferretdb, redis)
    finally:
        # The stopped servers' data is scratch (a copy of the template plus a test's rows), over
        # 100 MB a pair; a suite that kept it filled the disk it ran on. The logs stay.
        for server in (mariadb, ferretdb):
            shutil.rmtree(server.dir / "data", ignore_errors=True)


_TEMPLATES: dict[tuple, Path] = {}


def _template(init: dict[str, object]) -> Path:
    """The folder holding ``mariadb/`` and ``ferretdb/``: both data folders of a
    fresh, initialised pair of servers, stopped cleanly so that a copy starts
    as the original would."""
    key = tuple(sorted((k, repr(v)) for k, v in init.items()))
    if key in _TEMPLATES:
        return _TEMPLATES[key]
    folder = Path(tempfile.mkdtemp(prefix="chat-db-template-"))
    atexit.register(shutil.rmtree, folder, True)
    mariadb = MariaDB(fresh_dir(folder, "mariadb-server"), free_port())
    ferretdb = FerretDB(fresh_dir(folder, "ferretdb-server"), free_port())
    with running(mariadb), running(ferretdb):
        init_all(Databases(mariadb, ferretdb).settings(**init))
    (mariadb.dir / "data").rename(folder / "mariadb")
    (ferretdb.dir / "data").rename(folder / "ferretdb")
    _TEMPLATES[key] = folder
    return folder


@dataclass
class System:
    dbs: Databases
    logdir: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    api_port: int = field(default_factory=free_port)
    # the writer process's /metrics (its Mongo lag, for the benchmarks)
    writer_metrics_port: int = field(default_factory=free_port)
    # each pusher process's /metrics, by name: also its readiness (it listens once started)
    pusher_metrics_ports: dict[str, int] = field(default_factory=dict)
    daemon_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return env_for(self.dbs.mariadb, self.dbs.ferretdb, self.dbs.redis, CHAT_API_PORT=str(self.api_port),
                       CHAT_DAEMON_PORT=str(self.daemon_port), **self.env_extra)

    @property
    def secret(self) -> str:
        return self.env["CHAT_JWT_SECRET"]

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.daemon_port}"

    @property
    def poll_url(self) -> str:
        return f"http://127.0.0.1:{self.daemon_port}/v1/poll"

    def token(self, user: str, ttl: int = 3600) -> str:
        return auth.mint(self.secret, user, ttl)

    def start(self, name: str, wait: bool = True, **env_extra: str) -> subprocess.Popen:
        """Starts process ``name`` (its module, then ``_`` and a tag: ``pusher_b``);
        ``env_extra``: settings of this process alone, over the system's."""
        module = name.split("_")[0]
        log = open(self.logdir / f"{name}.log", "ab")
        env = {**self.env, **env_extra}
        if module == "writer":
            env = {**env, "CHAT_METRICS_PORT": str(self.writer_metrics_port)}
        elif module == "pusher":
            env = {**env, "CHAT_METRICS_PORT": str(self.pusher_metrics_ports.setdefault(name, free_port()))}
        proc = subprocess.Popen([sys.executable, "-m", module], env=env, cwd=ROOT, stdout=log, stderr=log)
        self.procs[name] = proc
        if module in ("writer", "relay"):
            wait_unix_listening(proc, self.env[SOCKETS[module]], 20)
            return proc
        if module == "pusher":
            wait_listening(proc, self.pusher_metrics_ports[name], 20)
            return proc
        port = self.api_port if module == "api" else self.daemon_port
        # The port is shared (SO_REUSEPORT): another process may answer on it
        # already. Wait for this one's own listening socket.
        wait_listening(proc, port, 20)
        if wait:
            self.wait_ready(name, pid=proc.pid)
        return proc

    def wait_ready(self, name: str, timeout: float = 30, pid: int | None = None) -> None:
        """Until the API answers /readyz, or a daemon /healthz "ok"; with ``pid``, that
        daemon itself: the port is shared, and one still starting refuses clients (503)."""
        url = (f"{self.api_url}/readyz" if name.startswith("api")
               else f"http://127.0.0.1:{self.daemon_port}/healthz")
        def ready() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(url, timeout=2)  # a new connection each time: any daemon may answer
                return (r.status_code == 200 and r.json()["status"] == "ok"
                        and (pid is None or name.startswith("api") or r.json()["pid"] == pid))
            return False

        eventually_sync(ready, f"{name} ready", timeout * FACTOR)

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        stop(self.procs.pop(name), sig)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):  # the writer last: the API processes' requests are answered
            self.stop(name)


def wait_listening(proc: subprocess.Popen, port: int, timeout: float) -> None:
    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        conns = psutil.Process(proc.pid).net_connections("tcp")
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)

    eventually_sync(listening, f"process {proc.pid} listens on {port}", timeout * FACTOR)


def wait_unix_listening(proc: subprocess.Popen, path: str, timeout: float) -> None:
    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {path}")
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(path)
            return True
        return False

    eventually_sync(listening, f"process {proc.pid} listens on {path}", timeout * FACTOR)


SOCKETS = {"writer": "CHAT_WRITER_SOCKET", "relay": "CHAT_OPLOG_RELAY_SOCKET"}


@contextlib.contextmanager
def running_system(dbs: Databases, daemons: int = 2, apis: int = 1, api_port: int | None = None,
                   writer: bool = False, relay: bool = False, **env: str) -> Iterator[System]:
    """``api_port`` fixes the API port up front, for settings that name it (a browser origin).
    ``writer``: the API processes write through one writer process, as deployed.
    ``relay``: the daemons tail the oplog through one relay process, as deployed."""
    logdir = Path(tempfile.mkdtemp(prefix="chat-system-"))
    if writer:
        env.setdefault("CHAT_WRITER_SOCKET", str(logdir / "writer.sock"))
    if relay:
        env.setdefault("CHAT_OPLOG_RELAY_SOCKET", str(logdir / "relay.sock"))
    system = System(dbs, logdir, {k: str(v) for k, v in env.items()})
    if api_port is not None:
        system.api_port = api_port
    try:
        if writer:
            system.start("writer")
        if relay:
            system.start("relay")
        for i in range(apis):
            system.start(f"api_{i}")
        for i in range(daemons):
            system.start(f"daemon_{i}")
        yield system
    except BaseException:
        system.stop_all()
        raise  # the logs stay behind, for whoever reads the failure
    system.stop_all()
    shutil.rmtree(logdir, ignore_errors=True)


@contextlib.contextmanager
def private_system(base: Path, daemons: int = 1, apis: int = 1, api_port: int | None = None,
                   writer: bool = False, relay: bool = False, **env: str) -> Iterator[System]:
    """A system on databases of its own, for tests that stop, restart or age them."""
    with databases(base) as dbs, running_system(dbs, daemons, apis, api_port, writer, relay, **env) as system:
        yield system
