"""Brings the cluster up and down: databases, Redis and Toxiproxy in chat-db, one
supervisord per application host, nginx in chat-edge.

``Cluster`` is a context manager: leaving it, on success, error or Ctrl-C,
stops every process it started and removes every namespace, veth and the
bridge (cluster.netns.teardown).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from chat.settings import Settings, StoresSettings
from chatctl.partitions import grow
from cluster import netns, nginx_conf, supervisor_conf
from cluster.partitions import ClusterDaemon, assign, leads_rule
from cluster.plan import (
    API_PORT,
    DAEMON_PORT_BASE,
    EDGE_PORT,
    MONGO_PORT,
    MYSQL_PORT,
    REDIS_PORT,
    TOXIPROXY_API_PORT,
    Plan,
)
from cluster.toxiproxy import Toxiproxy
from db.partition_map import load_slot_map
from harness.servers import FERRETDB, FERRETDB_GC, ferretdb_command, wait_port, wait_unix_socket

log = logging.getLogger("chat.cluster")

ROOT = Path(__file__).resolve().parent.parent
TOXIPROXY = ROOT / ".cache/toxiproxy/bin/toxiproxy-server"
NGINX = Path("/usr/sbin/nginx")
REDIS = Path("/usr/bin/redis-server")
MYSQL_USER = "chat"


class Cluster:
    def __init__(self, plan: Plan, state: Path | None = None, extra_env: dict[str, str] | None = None,
                 writes_led: bool = True):
        self.plan = plan
        # Partitioned: each partition's requests go to one host first (cluster.partitions.leader_of),
        # whose writer makes the copies owed to it; False: to any host, every writer making them.
        self.writes_led = writes_led
        self.state = state or ROOT / "var/cluster"
        self.extra_env = extra_env or {}
        self.secret = secrets.token_urlsafe(48)
        self.mysql_password = secrets.token_urlsafe(24)
        self.procs: dict[str, subprocess.Popen] = {}
        self.daemons: list[ClusterDaemon] = []
        self.partitions: int | None = None
        self.toxiproxy: Toxiproxy | None = None

    # ---- life cycle --------------------------------------------------------------
    def __enter__(self) -> Cluster:
        netns.require_root()
        for path in (TOXIPROXY, FERRETDB, NGINX, REDIS):
            if not path.exists():
                raise SystemExit(f"cluster: {path} is missing (make cluster installs it; or scripts/bootstrap.sh)")
        left = netns.teardown()
        if left:
            log.warning("event=cluster_leftovers_removed names=%s", ",".join(left))
        shutil.rmtree(self.state, ignore_errors=True)
        self.state.mkdir(parents=True)
        (self.state / "secret").write_text(self.secret + "\n")
        (self.state / "secret").chmod(0o600)
        try:
            netns.build(self.plan)
            self._start_databases()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.toxiproxy:
            self.toxiproxy.close()
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for ns in self.plan.namespaces:
            netns.kill_all_in(ns)
        netns.teardown()
        log.info("event=cluster_down")

    def _spawn(self, name: str, namespace: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log_path = self.state / "log" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(netns.in_namespace(namespace, argv), stdout=out, stderr=out,
                                    env=env or os.environ.copy(), cwd=ROOT, start_new_session=True)
        self.procs[name] = proc
        return proc

    # ---- databases -----------------------------------------------------------------
    def _start_databases(self) -> None:
        db = self.plan.db.address
        mysql_dir, ferret_dir, redis_dir = self.state / "db/mysql", self.state / "db/ferretdb", self.state / "db/redis"
        ferret_dir.mkdir(parents=True)
        redis_dir.mkdir(parents=True)
        # its own tmpdir: a starting mariadbd deletes every #sql* file in its
        # tmpdir, which in a shared /tmp are another server's live temporary tables
        (mysql_dir / "tmp").mkdir(parents=True)
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={mysql_dir / 'data'}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db", f"--tmpdir={mysql_dir / 'tmp'}"],
                       check=True, capture_output=True, timeout=120)
        socket_path = mysql_dir / "mysqld.sock"
        # skip-name-resolve: the namespaces have no DNS; grants name addresses
        mariadb = self._spawn("mariadb", self.plan.db.namespace, [
            "mariadbd", "--no-defaults", f"--datadir={mysql_dir / 'data'}", f"--socket={socket_path}",
            f"--port={MYSQL_PORT}", f"--tmpdir={mysql_dir / 'tmp'}", f"--bind-address={db}", "--user=root",
            "--skip-log-bin", "--skip-name-resolve",
            "--innodb-buffer-pool-size=128M", "--max-connections=500", f"--pid-file={mysql_dir / 'mariadb.pid'}"])
        command = ferretdb_command(ferret_dir, MONGO_PORT)
        command = [f"--listen-addr={db}:{MONGO_PORT}" if a.startswith("--listen-addr=") else a for a in command]
        ferret = self._spawn("ferretdb", self.plan.db.namespace, command, {**os.environ, **FERRETDB_GC})
        # Typing and presence (docs/presence.md): nothing in it is kept, so no snapshot and no
        # append log. Protected mode would refuse every client that is not on loopback, and the
        # hosts come through Toxiproxy from the namespace's own address.
        redis = self._spawn("redis", self.plan.db.namespace, [
            str(REDIS), "--bind", db, "--port", str(REDIS_PORT), "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--dir", str(redis_dir)])
        toxi = self._spawn("toxiproxy", self.plan.db.namespace,
                           [str(TOXIPROXY), "-host", db, "-port", str(TOXIPROXY_API_PORT)])
        wait_port(MYSQL_PORT, 60, mariadb, host=db)
        wait_unix_socket(socket_path, 60, mariadb)  # root connects through it, below
        wait_port(MONGO_PORT, 30, ferret, host=db)
        wait_port(REDIS_PORT, 20, redis, host=db)
        wait_port(TOXIPROXY_API_PORT, 15, toxi, host=db)
        root = create_engine(f"mysql+mysqldb://root@localhost/?unix_socket={socket_path}")
        with root.begin() as conn:
            conn.execute(text(f"CREATE USER IF NOT EXISTS '{MYSQL_USER}'@'%' IDENTIFIED BY :pw"),
                         {"pw": self.mysql_password})
            conn.execute(text(f"GRANT ALL PRIVILEGES ON *.* TO '{MYSQL_USER}'@'%'"))
        root.dispose()
        self.toxiproxy = Toxiproxy(self.plan.toxiproxy_api)
        self.toxiproxy.populate(self.plan.proxies())
        env = {**os.environ, "CHAT_MYSQL_URL": self.admin_mysql_url, "CHAT_MONGO_URL": self.admin_mongo_url}
        subprocess.run([sys.executable, "-m", "db.init"], env=env, cwd=ROOT, check=True, timeout=120,
                       capture_output=True)
        log.info("event=cluster_databases mysql=%s:%d mongo=%s:%d redis=%s:%d toxiproxy=%s", db, MYSQL_PORT, db,
                 MONGO_PORT, db, REDIS_PORT, self.plan.toxiproxy_api)

    def mysql_url(self, address: str, port: int) -> str:
        return f"mysql+mysqldb://{MYSQL_USER}:{self.mysql_password}@{address}:{port}/chat?charset=utf8mb4"

    @property
    def admin_mysql_url(self) -> str:
        """Straight to MariaDB, past Toxiproxy: for db.init and the bench's own connections."""
        return self.mysql_url(self.plan.db.address, MYSQL_PORT)

    @property
    def admin_mongo_url(self) -> str:
        return f"mongodb://{self.plan.db.address}:{MONGO_PORT}/?directConnection=true"

    @property
    def admin_redis_url(self) -> str:
        """Straight to Redis, past Toxiproxy."""
        return f"redis://{self.plan.db.address}:{REDIS_PORT}/0"

    def grow_partitions(self, partitions: int) -> None:
        settings = Settings(stores=StoresSettings(mysql_url=self.admin_mysql_url, mongo_url=self.admin_mongo_url))
        engine = create_engine(self.admin_mysql_url)
        try:
            current = load_slot_map(engine).partitions
        finally:
            engine.dispose()
        if partitions > current:
            log.info("event=cluster_partitions_grown %s", grow(settings, partitions).replace("\n", " "))

    def set_rtt(self, rtt_ms: float) -> None:
        assert self.toxiproxy
        for proxy in self.plan.proxies():
            self.toxiproxy.set_latency(proxy.name, rtt_ms)

    # ---- application hosts and the edge --------------------------------------------------
    def host_env(self, namespace: str) -> dict[str, str]:
        """Every store through the host's own Toxiproxy proxies."""
        mysql = self.plan.proxy(namespace, "mysql").listen
        address, port = mysql.rsplit(":", 1)
        return {"CHAT_MYSQL_URL": self.mysql_url(address, int(port)),
                "CHAT_MONGO_URL": f"mongodb://{self.plan.proxy(namespace, 'mongo').listen}/?directConnection=true",
                "CHAT_REDIS_URL": f"redis://{self.plan.proxy(namespace, 'redis').listen}/0",
                "CHAT_JWT_SECRET": self.secret, **self.extra_env}

    def start_hosts(self, partitions: int | None = None, wait: float = 90) -> None:
        """Every host's supervisord, then nginx. ``partitions``: None runs today's unpartitioned settings.

        The slot map lives in MySQL: with the hosts stopped, it grows to ``partitions`` first,
        the way an operator grows it (``chatctl partitions grow``)."""
        self.partitions = partitions
        if partitions:
            self.grow_partitions(partitions)
        hosts = [(h.namespace, h.address) for h in self.plan.hosts]
        self.daemons = assign(hosts, self.plan.daemons_per_host, partitions or 1, DAEMON_PORT_BASE)
        for host in self.plan.hosts:
            self._start_host(host.namespace)
        self._start_edge()
        deadline = time.monotonic() + wait
        for host in self.plan.hosts:
            self.wait_host_ready(host.namespace, deadline)
        wait_port(EDGE_PORT, max(1.0, deadline - time.monotonic()), self.procs["nginx"], host=self.plan.edge.address)

    def _start_host(self, namespace: str) -> None:
        host = next(h for h in self.plan.hosts if h.namespace == namespace)
        root = self.state / namespace
        for sub in ("log", "run"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        index = self.plan.hosts.index(host)
        spec = supervisor_conf.HostSpec(namespace, host.address, root, ROOT, Path(sys.executable),
                                        self.host_env(namespace), [d for d in self.daemons if d.host == namespace],
                                        self.partitions,
                                        # a --set CHAT_WRITER_LEADS (even empty) is the bench's to choose
                                        leads_rule(index, len(self.plan.hosts))
                                        if self.writes_led and "CHAT_WRITER_LEADS" not in self.extra_env else "")
        conf = root / "supervisord.conf"
        conf.write_text(supervisor_conf.render(spec))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHAT_")}
        self._spawn(f"supervisord-{namespace}", namespace,
                    [str(Path(sys.executable).with_name("supervisord")), "-n", "-c", str(conf)], env)

    def wait_host_ready(self, namespace: str, deadline: float) -> None:
        host = next(h for h in self.plan.hosts if h.namespace == namespace)
        urls = [f"http://{host.address}:{API_PORT}/readyz"]
        urls += [f"http://{d.address}:{d.port}/healthz" for d in self.daemons if d.host == namespace]
        for url in urls:
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    r = httpx.get(url, timeout=2)
                    if r.status_code == 200 and r.json().get("status") == "ok":
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url} not ready (logs: {self.state / namespace / 'log'})")
                time.sleep(0.2)

    def _start_edge(self) -> None:
        root = self.state / "edge"
        root.mkdir(parents=True, exist_ok=True)
        paths = nginx_conf.EdgePaths(root)
        apis = [f"{h.address}:{API_PORT}" for h in self.plan.hosts]
        conf = root / "nginx.conf"
        conf.write_text(nginx_conf.render(f"{self.plan.edge.address}:{EDGE_PORT}", apis, self.daemons,
                                          self.partitions or 1, paths))
        check = subprocess.run(netns.in_namespace(self.plan.edge.namespace,
                                                  [str(NGINX), "-t", "-q", "-p", str(root), "-c", str(conf)]),
                               capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t: {check.stderr}")
        self._spawn("nginx", self.plan.edge.namespace, [str(NGINX), "-p", str(root), "-c", str(conf)])

    def kill_host(self, namespace: str) -> int:
        """kill -9 of every process of the host (supervisord and all it runs)."""
        killed = netns.kill_all_in(namespace)
        self._reap(f"supervisord-{namespace}")
        return killed

    def _reap(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def restart_host(self, namespace: str, wait: float = 60) -> None:
        self.kill_host(namespace)
        self._start_host(namespace)
        self.wait_host_ready(namespace, time.monotonic() + wait)

    def stop_hosts(self) -> None:
        """Every host and the edge, killed (their state is the databases'): between bench runs."""
        for ns in [h.namespace for h in self.plan.hosts] + [self.plan.edge.namespace]:
            netns.kill_all_in(ns)
        for name in [n for n in self.procs if n.startswith("supervisord-") or n == "nginx"]:
            self._reap(name)

    def host_pids(self) -> list[int]:
        return [pid for ns in self.plan.namespaces for pid in netns.pids_in(ns)]

    def banner(self) -> str:
        p = self.plan
        lines = [f"  chat cluster is up: {len(p.hosts)} hosts, subnet {p.subnet} on bridge {netns.BRIDGE} "
                 f"(the root namespace is {p.bridge_address}); Ctrl-C stops it and removes it all",
                 f"    edge (nginx)   {p.edge.namespace:10} {p.edge_url}   /v1/messages -> APIs, /v1/ws /v1/poll "
                 "-> daemons (?partition=k)",
                 f"    databases      {p.db.namespace:10} MariaDB {p.db.address}:{MYSQL_PORT}  FerretDB "
                 f"{p.db.address}:{MONGO_PORT}  Redis {p.db.address}:{REDIS_PORT}  Toxiproxy API {p.toxiproxy_api}"]
        for h in p.hosts:
            daemons = "  ".join(f":{d.port}" for d in self.daemons if d.host == h.namespace)
            lines.append(f"    host           {h.namespace:10} {h.address}  api :{API_PORT}  daemons {daemons}  "
                         f"(MySQL via {p.proxy(h.namespace, 'mysql').listen}, Mongo via "
                         f"{p.proxy(h.namespace, 'mongo').listen}, Redis via {p.proxy(h.namespace, 'redis').listen})")
        lines += ["", "  Try it (the token secret is in var/cluster/secret):",
                  "    export CHAT_JWT_SECRET=$(cat var/cluster/secret)",
                  "    BOB=$(.venv/bin/chatctl token bob); ALICE=$(.venv/bin/chatctl token alice)",
                  f"    ip netns exec {p.edge.namespace} curl -s {p.edge_url}/readyz",
                  f"    ip netns exec {p.edge.namespace} curl -sN {p.edge_url}/v1/poll "
                  "-H \"Authorization: Bearer $BOB\" &",
                  f"    curl -s -X POST {p.edge_url}/v1/messages -H \"Authorization: Bearer $ALICE\" "
                  "-H 'Content-Type: application/json' -d '{\"to\": \"bob\", \"body\": \"hello\"}'",
                  f"    curl -s \"{p.edge_url}/v1/presence?users=bob\" -H \"Authorization: Bearer $ALICE\"",
                  f"  Faults: curl -s -X POST {p.toxiproxy_api}/proxies/chat-h1-mysql -d '{{\"enabled\": false}}' "
                  "(and chat-h1-mongo, chat-h1-redis)",
                  f"  Logs: {self.state}/<namespace>/log, {self.state}/log"]
        return "\n".join(lines)


def stop_on_sigterm() -> None:
    """SIGTERM leaves like Ctrl-C: through every finally, so the cluster is removed."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)
