"""Static checks of deploy/: the production material an operator applies by hand.

No servers, no network, nothing installed. There is no Docker engine and no
real MongoDB on the development machine, so compose.yaml, the Dockerfile and
the MongoDB files are checked for structure and for agreement with the code
(settings defaults, ports, timeouts). Where a real validator happens to be
installed it is used, and the test is skipped with the reason otherwise:
`nginx -t`, `docker compose config` (which embeds the official Compose
schema: the schema cannot be fetched here, no network), `systemd-analyze
verify`, `mariadbd --help` and `node --check`.
"""

from __future__ import annotations

import configparser
import inspect
import json
import math
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from chat.serve import reuseport_socket
from chat.settings import Settings, env_names
from tests.nginx_checks import (block, blocks, daemon_location_problems, directive, ejecting_daemon_servers, servers,
                                upstreams)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
SUPERVISORD = DEPLOY / "supervisord.prod.conf"
UNIT = DEPLOY / "systemd" / "chat-delivery.service"
SYSCTL = DEPLOY / "os" / "sysctl.d" / "90-chat.conf"
LIMITS = DEPLOY / "os" / "limits.d" / "90-chat.conf"
MONGOD = DEPLOY / "mongodb" / "mongod.conf"
INIT_JS = DEPLOY / "mongodb" / "init-replica-set.js"
NGINX = DEPLOY / "nginx"
MYSQL_CNF = DEPLOY / "mysql" / "my.cnf.d" / "chat.cnf"
GRANTS = DEPLOY / "mysql" / "grants.sql"
ENV_EXAMPLE = DEPLOY / "chat-delivery.env.example"
DOCKERFILE = DEPLOY / "Dockerfile"

# The daemons' own Mongo and MySQL URLs (supervisord.prod.conf hands them over as
# CHAT_MONGO_URL and CHAT_MYSQL_URL).
EXTRA_ENV = {"CHAT_DAEMON_MONGO_URL", "CHAT_DAEMON_MYSQL_URL"}


def default(path: str):
    """A setting's coded default (not whatever the test environment sets), e.g. ``"api.port"``."""
    return Settings.field(path).get_default(call_default_factory=True)


# ---- YAML ---------------------------------------------------------------------

YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), MONGOD])


def test_deploy_has_yaml_files():
    assert COMPOSE in YAML_FILES and MONGOD in YAML_FILES


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path):
    assert isinstance(yaml.safe_load(path.read_text()), dict)


# ---- compose.yaml ---------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def tokens(command) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


def depends_on(service: dict) -> dict[str, str]:
    deps = service.get("depends_on", {})
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def test_compose_says_it_is_untested():
    head = "\n".join(COMPOSE.read_text().splitlines()[:5]).lower()
    assert "untested" in head and "no docker engine" in head


def test_compose_has_the_services(compose):
    services = {"mongo1", "mongo2", "mongo3", "mongo-init", "mariadb", "redis", "migrate", "app"}
    assert services <= set(compose["services"])


def test_compose_three_mongo_members_form_rs0(compose):
    members = [name for name, s in compose["services"].items() if "--replSet" in tokens(s.get("command", []))]
    assert sorted(members) == ["mongo1", "mongo2", "mongo3"]
    for name in members:
        service = compose["services"][name]
        args = tokens(service["command"])
        assert args[args.index("--replSet") + 1] == "rs0", name
        assert "--bind_ip_all" in args, name
        assert service["image"] == "mongo:7.0", name
        assert "healthcheck" in service, name


def test_compose_depends_on_targets_exist(compose):
    services = compose["services"]
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, service in services.items():
        for target, condition in depends_on(service).items():
            assert target in services, f"{name} depends on unknown service {target}"
            assert target != name
            assert condition in conditions, (name, target, condition)
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target} to be healthy: no healthcheck"


def test_compose_one_shots_run_in_order(compose):
    services = compose["services"]
    init = services["mongo-init"]
    assert depends_on(init) == dict.fromkeys(("mongo1", "mongo2", "mongo3"), "service_healthy")
    assert "mongosh" in tokens(init["command"]) and "/init-replica-set.js" in tokens(init["command"])
    assert "mongodb://mongo1:27017" in " ".join(tokens(init["command"]))
    assert tokens(services["migrate"]["command"])[-2:] == ["-m", "db.init"]
    assert depends_on(services["migrate"]) == {"mariadb": "service_healthy",
                                              "mongo-init": "service_completed_successfully"}
    assert depends_on(services["app"]) == {"migrate": "service_completed_successfully", "redis": "service_healthy"}
    assert services["mariadb"]["image"] == "mariadb:10.11"
    assert services["mariadb"]["environment"]["MARIADB_DATABASE"] == "chat"


def test_compose_app(compose):
    app = compose["services"]["app"]
    assert app["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    published = {str(p).split(":")[-1] for p in app["ports"]}
    assert published == {str(default("api.port")), str(default("daemon.port"))}
    env = app["environment"]
    assert env["CHAT_JWT_SECRET"] == "${CHAT_JWT_SECRET:?set it}"  # no default secret, ever
    assert set(env) <= env_names() | EXTRA_ENV
    # Longer than both supervisord groups' stop (daemons, then API).
    grace = int(str(app["stop_grace_period"]).rstrip("s"))
    assert grace > sum(stopwaitsecs(supervisord_config()).values())


def test_compose_redis_keeps_nothing_and_every_process_reaches_it(compose):
    redis = compose["services"]["redis"]
    args = tokens(redis["command"])
    assert args[0] == "redis-server" and "healthcheck" in redis
    assert args[args.index("--save") + 1] == "" and args[args.index("--appendonly") + 1] == "no"
    assert compose["services"]["app"]["environment"]["CHAT_REDIS_URL"] == "redis://redis:6379/0"


def test_compose_mongo_urls_follow_the_read_concern_rule(compose):
    env = compose["services"]["app"]["environment"]
    check_mongo_urls(env["CHAT_MONGO_URL"], env["CHAT_DAEMON_MONGO_URL"])


def test_compose_paths_exist(compose):
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).resolve().is_file(), f"{name}: {source} missing"
            else:
                assert source in declared, f"{name}: named volume {source} not declared"
        if "build" in service:
            context = (DEPLOY / service["build"]["context"]).resolve()
            assert (context / service["build"]["dockerfile"]).is_file(), name


def compose_validator() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_against_the_official_schema():
    validator = compose_validator()
    if validator is None:
        pytest.skip("no offline Compose validator here (no `docker compose` plugin or docker-compose); "
                    "the official JSON schema cannot be fetched without network")
    env = {**os.environ, "CHAT_JWT_SECRET": "x" * 32, "CHAT_MONGO_PASSWORD": "pw",
           "MARIADB_PASSWORD": "pw", "MARIADB_ROOT_PASSWORD": "pw"}
    result = subprocess.run([*validator, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr


# ---- Dockerfile -------------------------------------------------------------------

def test_dockerfile():
    text = DOCKERFILE.read_text()
    assert "untested" in text.lower()
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert stages and all(image == "python:3.11-slim-bookworm" for image in stages)
    for package in ("libmariadb-dev", "pkg-config", "build-essential"):
        assert re.search(rf"apt-get install[^\n]*\b{package}\b", text), package
    assert re.search(r"pip install [^\n]*\s\.$", text, re.M)
    assert re.search(r"^EXPOSE 8000 8100$", text, re.M)
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert cmd[-1].endswith("deploy/supervisord.prod.conf") and "-n" in cmd
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", "var", ".cache", ".git"} <= set(ignored)


# ---- supervisord.prod.conf ------------------------------------------------------------

def supervisord_config() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)  # %(here)s is supervisord's
    parser.read(SUPERVISORD)
    return parser


def stopwaitsecs(parser: configparser.ConfigParser) -> dict[str, int]:
    return {s.split(":", 1)[1]: parser.getint(s, "stopwaitsecs", fallback=10)
            for s in parser.sections() if s.startswith("program:")}


def test_supervisord_prod_runs_only_the_system():
    parser = supervisord_config()
    programs = {s.split(":", 1)[1] for s in parser.sections() if s.startswith("program:")}
    assert programs == {"writer", "api", "relay", "daemon", "pusher"}  # no mariadb, ferretdb or init
    assert parser.getint("program:writer", "numprocs", fallback=1) == 1  # one group commit per host
    assert parser.getint("program:relay", "numprocs", fallback=1) == 1  # one oplog tail per host
    assert parser.getint("program:pusher", "numprocs", fallback=1) == 1  # partitions are leased across hosts
    assert parser.getint("program:api", "numprocs") == 4
    assert parser.getint("program:daemon", "numprocs") == 6
    for name in programs:
        section = parser[f"program:{name}"]
        assert section["command"] == f"%(here)s/../.venv/bin/python -m {name}"
        assert (ROOT / name / "__main__.py").is_file()
        assert section["directory"] == "%(here)s/.."
        assert section["stopsignal"] == "TERM"
        assert section["autorestart"] == "true"
        assert section.getint("startretries") >= 100
        assert section.getint("stopwaitsecs") == 20
        assert section["stdout_logfile"].startswith("/var/log/chat-delivery/")
        assert section.getint("stdout_logfile_backups") > 0
    assert parser["unix_http_server"]["file"].startswith("/run/chat-delivery/")
    assert parser["supervisord"]["logfile"].startswith("/var/log/chat-delivery/")


def test_dev_login_is_on_in_development_only():
    assert default("auth.dev_login") is False
    prod = SUPERVISORD.read_text() + ENV_EXAMPLE.read_text() + COMPOSE.read_text() + UNIT.read_text()
    assert "CHAT_DEV_LOGIN" not in prod
    dev = configparser.ConfigParser(interpolation=None)
    dev.read(ROOT / "supervisord.conf")
    assert 'CHAT_DEV_LOGIN="true"' in dev["program:api"]["environment"].split(",")
    assert "CHAT_DEV_LOGIN" not in dev["program:daemon"].get("environment", "")


def test_daemon_stopwaitsecs_exceeds_the_drain():
    assert stopwaitsecs(supervisord_config())["daemon"] > default("daemon.drain_seconds")


def prod_config_copy(tmp_path: Path) -> Path:
    """The prod config with its system paths pointed into tmp_path (supervisord
    insists that log and socket directories exist)."""
    (tmp_path / "deploy").mkdir()
    for d in ("log", "run"):
        (tmp_path / d).mkdir()
    text = SUPERVISORD.read_text()
    for prod, tmp in (("/var/log/chat-delivery", tmp_path / "log"), ("/run/chat-delivery", tmp_path / "run")):
        assert prod in text
        text = text.replace(prod, str(tmp))
    copy = tmp_path / "deploy" / SUPERVISORD.name
    copy.write_text(text)
    return copy


def test_supervisord_itself_accepts_the_prod_config(tmp_path, monkeypatch):
    from supervisor.options import ServerOptions

    url = "mongodb://chat_app:pw@mongo1,mongo2,mongo3/?replicaSet=rs0&w=majority"
    mysql_url = "mysql+mysqldb://chat_daemon:pw@db.internal/chat?charset=utf8mb4"
    monkeypatch.setenv("CHAT_DAEMON_MONGO_URL", url)
    monkeypatch.setenv("CHAT_DAEMON_MYSQL_URL", mysql_url)
    options = ServerOptions()
    options.configfile = str(prod_config_copy(tmp_path))
    options.process_config(do_usage=False)
    groups = {g.name: g for g in options.process_group_configs}
    assert {name: len(g.process_configs) for name, g in groups.items()} == {"writer": 1, "api": 4, "relay": 1,
                                                                             "daemon": 6, "pusher": 1}
    # daemons stop first, their relay after them
    assert groups["daemon"].priority > groups["relay"].priority > groups["api"].priority > groups["writer"].priority
    socket = f"{tmp_path}/run/writer.sock"  # where the API processes find the writer (/run/chat-delivery there)
    assert groups["writer"].process_configs[0].environment["CHAT_WRITER_SOCKET"] == socket
    assert all(p.environment["CHAT_WRITER_SOCKET"] == socket for p in groups["api"].process_configs)
    relay_socket = f"{tmp_path}/run/relay.sock"  # where the daemons get their oplog entries
    assert groups["relay"].process_configs[0].environment == {
        "CHAT_MONGO_URL": url, "CHAT_OPLOG_RELAY_SOCKET": relay_socket, "CHAT_METRICS_PORT": "9300"}
    daemon = groups["daemon"].process_configs[0]
    assert daemon.environment == {"CHAT_MONGO_URL": url, "CHAT_MYSQL_URL": mysql_url, "CHAT_METRICS_PORT": "9100",
                                  "CHAT_OPLOG_RELAY_SOCKET": relay_socket,  # commas and & survive
                                  "CHAT_WRITER_SOCKET": socket}  # clients' acks and read markers go there
    assert daemon.command.endswith("/deploy/../.venv/bin/python -m daemon")
    assert options.minfds == 20000


def test_supervisord_refuses_to_start_without_the_daemon_mongo_url(tmp_path, monkeypatch):
    from supervisor.options import ServerOptions

    monkeypatch.delenv("CHAT_DAEMON_MONGO_URL", raising=False)
    monkeypatch.setenv("CHAT_DAEMON_MYSQL_URL", "mysql+mysqldb://chat_daemon:pw@db.internal/chat")
    options = ServerOptions()
    options.configfile = str(prod_config_copy(tmp_path))
    with pytest.raises(ValueError, match="ENV_CHAT_DAEMON_MONGO_URL"):
        options.process_config(do_usage=False)


def test_supervisord_refuses_to_start_without_the_daemon_mysql_url(tmp_path, monkeypatch):
    from supervisor.options import ServerOptions

    monkeypatch.setenv("CHAT_DAEMON_MONGO_URL", "mongodb://chat_app:pw@mongo1/?replicaSet=rs0&w=majority")
    monkeypatch.delenv("CHAT_DAEMON_MYSQL_URL", raising=False)
    options = ServerOptions()
    options.configfile = str(prod_config_copy(tmp_path))
    with pytest.raises(ValueError, match="ENV_CHAT_DAEMON_MYSQL_URL"):
        options.process_config(do_usage=False)


# ---- systemd unit -------------------------------------------------------------------

def unit_config() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(UNIT)
    return parser


def systemd_seconds(value: str) -> float:
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


def test_systemd_unit():
    service = unit_config()["Service"]
    assert service["ExecStart"] == ("/opt/chat-delivery/.venv/bin/supervisord -n "
                                    "-c /opt/chat-delivery/deploy/supervisord.prod.conf")
    assert service["User"] == "chat"
    assert service["EnvironmentFile"] == "/etc/chat-delivery.env"
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["LimitNOFILE"]) >= supervisord_config().getint("supervisord", "minfds")
    assert unit_config()["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_stop_timeout_exceeds_supervisord_stopwaitsecs():
    timeout = systemd_seconds(unit_config()["Service"]["TimeoutStopSec"])
    waits = stopwaitsecs(supervisord_config())
    assert timeout > waits["daemon"]
    # supervisord stops its groups one after the other: daemons, then the API.
    assert timeout > sum(waits.values())


def test_systemd_analyze_verify():
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    result = subprocess.run([tool, "verify", str(UNIT)], capture_output=True, text=True)
    # Only complaints about the file itself count: the executable under
    # /opt/chat-delivery does not exist on a development machine.
    problems = [line for line in (result.stdout + result.stderr).splitlines() if f"{UNIT}:" in line]
    assert problems == []


# ---- OS: sysctl and limits ---------------------------------------------------------------

def sysctl_settings() -> dict[str, str]:
    settings = {}
    for number, line in enumerate(SYSCTL.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(r"([a-z0-9_.\-]+) = (\S(?:.*\S)?)", line)
        assert match, f"line {number} is not `key = value`: {line!r}"
        key, value = match.groups()
        assert key not in settings, f"{key} set twice"
        settings[key] = value
    return settings


def test_sysctl_has_the_settings():
    assert set(sysctl_settings()) == {
        "net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog", "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_mem", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "fs.file-max",
        "net.ipv4.tcp_fin_timeout", "net.core.netdev_max_backlog"}


def test_sysctl_keys_exist_in_proc_sys():
    checked = []
    for key, value in sysctl_settings().items():
        path = Path("/proc/sys") / key.replace(".", "/")
        if not path.parent.is_dir():
            continue  # this machine (a container) does not show that subsystem
        assert path.exists(), f"{key}: no {path} (a typo?)"
        live = path.read_text().split()
        assert len(value.split()) == len(live), f"{key}: {value!r} vs this kernel's {' '.join(live)!r}"
        checked.append(key)
    if not checked:
        pytest.skip("/proc/sys shows none of these subsystems here")


def test_sysctl_values_fit_the_code():
    s = {k: [int(x) for x in v.split()] for k, v in sysctl_settings().items()}
    backlog = inspect.signature(reuseport_socket).parameters["backlog"].default
    assert s["net.core.somaxconn"][0] >= backlog  # else the kernel truncates our listen backlog
    low, high = s["net.ipv4.ip_local_port_range"]
    assert low < high
    # Our listening ports stay outside the ephemeral range, so an outgoing
    # connection can never hold the port a restarting process needs.
    assert max(default("api.port"), default("daemon.port")) < low
    for key in ("net.ipv4.tcp_mem", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
        assert s[key] == sorted(s[key]), key


def test_limits_nofile_for_chat():
    entries = {}
    for line in LIMITS.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            domain, kind, item, value = line.split()
            entries[(domain, kind, item)] = int(value)
    assert set(entries) == {("chat", "soft", "nofile"), ("chat", "hard", "nofile")}
    minfds = supervisord_config().getint("supervisord", "minfds")
    assert all(v >= minfds for v in entries.values())
    assert entries[("chat", "hard", "nofile")] == int(unit_config()["Service"]["LimitNOFILE"])
    assert default("daemon.max_connections") < minfds  # room for the other files of a daemon


# ---- MongoDB -----------------------------------------------------------------------------

def test_mongod_conf():
    conf = yaml.safe_load(MONGOD.read_text())
    assert conf["replication"]["replSetName"] == "rs0"
    assert conf["storage"]["engine"] == "wiredTiger"
    assert conf["net"]["bindIp"]
    oplog_mb = conf["replication"]["oplogSizeMB"]
    assert isinstance(oplog_mb, int)
    # The documented requirement: 5,000 msg/s x 600 B x 24 h, in MiB, at least.
    assert oplog_mb >= math.ceil(5000 * 600 * 86_400 / 2**20)


def test_init_replica_set_js():
    text = INIT_JS.read_text()
    for needle in ("rs.initiate", "isWritablePrimary", "expireAfterSeconds", "setDefaultRWConcern",
                   'w: "majority"', '"to_id"', '"from_id"', '"created_at_ttl"', "chat_app",
                   'role: "readWrite", db: "chat"', 'role: "read", db: "local"'):
        assert needle in text, needle
    assert re.findall(r'"(mongo\d):27017"', text) == ["mongo1", "mongo2", "mongo3"]
    assert str(default("stores.retention_seconds")) in text  # the TTL db.init asks for too


def test_init_replica_set_js_syntax():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    result = subprocess.run([node, "--check", str(INIT_JS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def check_mongo_urls(api_url: str, daemon_url: str) -> None:
    for url in (api_url, daemon_url):
        assert "replicaSet=rs0" in url and "w=majority" in url, url
    assert "readConcernLevel=majority" in api_url
    # The daemons' queries must read at the oplog tail's read concern.
    assert "readConcernLevel" not in daemon_url


# ---- MySQL --------------------------------------------------------------------------------

def grants(text: str) -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for privs, target, user in re.findall(r"GRANT\s+(.+?)\s+ON\s+(\S+)\s+TO\s+'(\w+)'@'%'", text, re.S):
        found.setdefault((user, target), set()).update(p.strip() for p in privs.split(","))
    return found


def test_grants_are_least_privilege():
    assert grants(GRANTS.read_text()) == {
        ("chat_api", "chat.messages"): {"SELECT", "INSERT", "UPDATE"},
        ("chat_api", "chat.stream_state"): {"SELECT", "INSERT", "UPDATE"},
        ("chat_api", "chat.partition_map"): {"SELECT"},
        ("chat_api", "chat.echoes"): {"SELECT", "INSERT", "DELETE"},
        ("chat_daemon", "chat.messages"): {"SELECT"},
        ("chat_daemon", "chat.partition_map"): {"SELECT"},
        ("chat_migrate", "chat.*"): {"ALTER", "CREATE", "DROP", "INDEX", "REFERENCES",
                                     "SELECT", "INSERT", "UPDATE", "DELETE"},
    }
    # Passwords come from session variables, never from the file.
    after = re.findall(r"IDENTIFIED BY (.{12})", GRANTS.read_text())
    assert after and all(a.startswith("', QUOTE(@") for a in after), after


def test_mysql_cnf():
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(MYSQL_CNF)
    mysqld = {k.replace("-", "_"): v.split("#")[0].strip() for k, v in parser["mysqld"].items()}
    assert mysqld["character_set_server"] == "utf8mb4"
    assert mysqld["collation_server"] == "utf8mb4_bin"
    assert mysqld["innodb_flush_log_at_trx_commit"] == "1"
    assert mysqld["sync_binlog"] == "1"
    assert mysqld["binlog_format"] == "ROW"
    for key in ("innodb_buffer_pool_size", "max_connections", "wait_timeout"):
        assert key in mysqld


def test_mariadbd_accepts_chat_cnf():
    server = shutil.which("mariadbd") or shutil.which("mysqld")
    if server is None:
        pytest.skip("no mariadbd on this machine")
    result = subprocess.run([server, f"--defaults-file={MYSQL_CNF}", "--verbose", "--help"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "unknown variable" not in result.stderr, result.stderr[-2000:]


# ---- environment template -------------------------------------------------------------------

def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split("=", 1)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]  # systemd strips one level of quotes
            values[key] = value
    return values


def test_env_example_is_valid_settings(monkeypatch):
    values = env_example()
    assert set(values) <= env_names() | EXTRA_ENV
    for key in list(os.environ):
        if key.startswith("CHAT_"):
            monkeypatch.delenv(key)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = Settings(_env_file=None)
    assert settings.daemon.allowed_origins == ["https://chat.example.com"]
    assert settings.api.public_daemon_url == "https://chat.example.com"  # the page reaches the daemons via nginx
    assert settings.auth.dev_login is False
    assert settings.api.host == settings.daemon.host == "0.0.0.0"
    assert settings.stores.redis_url.get_secret_value().startswith("redis://:")  # typing and presence, with a password
    check_mongo_urls(values["CHAT_MONGO_URL"], values["CHAT_DAEMON_MONGO_URL"])


# ---- nginx ----------------------------------------------------------------------------------

def seconds(value: str) -> int:
    assert value.endswith("s"), value
    return int(value[:-1])


def test_nginx_site_matches_the_code():
    conf = (NGINX / "chat.conf").read_text()
    assert "map $http_upgrade $connection_upgrade" in conf
    assert "include chat.conf;" in (NGINX / "nginx.conf").read_text()
    daemons, api = block(conf, "upstream chat_daemons"), block(conf, "upstream chat_api")
    # ?partition=k picks partition k's daemons; without it, chat_daemons
    routes = block(conf, "map $arg_partition $chat_daemons")
    assert directive(routes, "default") == "chat_daemons"
    for k, upstream in re.findall(r"^\s*(\d+)\s+(\S+);", routes, re.M):
        assert upstream == f"chat_daemons_p{k}"
        assert all(s.endswith(f":{default('daemon.port')}")
                   for s in re.findall(r"server\s+(\S+)", block(conf, f"upstream {upstream}")))
    assert "least_conn;" in daemons and "keepalive" in api
    assert all(s.endswith(f":{default('daemon.port')}") for s in re.findall(r"server\s+(\S+)", daemons))
    assert all(s.endswith(f":{default('api.port')}") for s in re.findall(r"server\s+(\S+)", api))
    (tls,) = [body for body in blocks(conf, "server") if re.search(r"^\s*listen 443 ssl;", body, re.M)]
    assert directive(tls, "ssl_protocols") == "TLSv1.2 TLSv1.3"
    assert directive(tls, "ssl_certificate") and directive(tls, "ssl_certificate_key")
    size = directive(tls, "client_max_body_size")
    assert int(size.rstrip("k")) * 1024 == default("api.request_max_bytes")

    ws = block(tls, "location = /v1/ws")
    assert "proxy_pass http://$chat_daemons;" in ws
    assert directive(ws, "proxy_set_header Upgrade") == "$http_upgrade"
    assert directive(ws, "proxy_set_header Connection") == "$connection_upgrade"
    assert seconds(directive(ws, "proxy_read_timeout")) > (
        default("daemon.ping_interval_seconds") + default("daemon.ping_timeout_seconds"))

    poll = block(tls, "location = /v1/poll")
    assert "proxy_pass http://$chat_daemons;" in poll
    assert directive(poll, "proxy_buffering") == "off"
    assert seconds(directive(poll, "proxy_read_timeout")) > default("daemon.poll_max_timeout_seconds")

    assert "proxy_pass http://$chat_api;" in block(tls, "location /")
    # ?partition=k sends an API request to k's leading API first, the others only while it is down
    leads = block(conf, "map $arg_partition $chat_api")
    assert directive(leads, "default") == "chat_api"
    led = re.findall(r"^\s*(\d+)\s+(\S+);", leads, re.M)
    assert [k for k, _ in led] == ["0", "1"]
    every_api = sorted(address for address, _ in servers(api))
    for _, upstream in led:
        lines = servers(block(conf, f"upstream {upstream}"))
        assert sorted(address for address, _ in lines) == every_api
        assert ["backup" in params for _, params in lines] == [False] + [True] * (len(lines) - 1)
    assert len({servers(block(conf, f"upstream {u}"))[0][0] for _, u in led}) == 2  # a leader each
    assert directive(block(tls, "location /"), "proxy_next_upstream") == "error timeout"  # never a POST sent


def test_nginx_site_never_shuts_a_daemon_out_and_passes_a_failed_connect_on():
    """docs/decisions/proxy-health-for-websockets.md: after every daemon restarted at once,
    passive health checks shut WebSocket clients out for minutes."""
    conf = (NGINX / "chat.conf").read_text()
    daemon_upstreams = [name for name in upstreams(conf) if name.startswith("chat_daemons")]
    assert daemon_upstreams == ["chat_daemons", "chat_daemons_p0", "chat_daemons_p1"]
    assert ejecting_daemon_servers(conf) == []
    (tls,) = [body for body in blocks(conf, "server") if re.search(r"^\s*listen 443 ssl;", body, re.M)]
    for path in ("/v1/ws", "/v1/poll"):
        assert daemon_location_problems(block(tls, f"location = {path}")) == [], path
    # The API's requests end within seconds, so its passive check takes a host back at once.
    assert all(params.get("max_fails") != "0" and "fail_timeout" in params
               for _, params in servers(upstreams(conf)["chat_api"]))
    # No query strings in the access log: they carry tokens.
    log_format = conf[conf.index("log_format chat"):conf.index(";", conf.index("log_format chat"))]
    assert "$request " not in log_format and "$args" not in log_format and "$uri" in log_format


# Production paths in the nginx files -> where the test copy points them.
NGINX_PATHS = ("/etc/ssl/chat/fullchain.pem", "/etc/ssl/chat/privkey.pem", "/var/log/nginx/", "/run/nginx.pid")


def test_nginx_t_accepts_the_config(tmp_path):
    nginx = shutil.which("nginx")
    if nginx is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light); `nginx -t` not run")
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed: no throwaway certificate for `nginx -t`")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                    "-days", "1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    (tmp_path / "logs").mkdir()
    targets = dict(zip(NGINX_PATHS, (str(cert), str(key), f"{tmp_path}/logs/", f"{tmp_path}/nginx.pid"), strict=True))
    originals = {name: (NGINX / name).read_text() for name in ("nginx.conf", "chat.conf")}
    for path in NGINX_PATHS:
        assert any(path in text for text in originals.values()), f"{path} no longer in the config"
    for name, text in originals.items():
        for prod, tmp in targets.items():
            text = text.replace(prod, tmp)
        (tmp_path / name).write_text(text)  # `include chat.conf` resolves next to nginx.conf
    result = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


# ---- docs ----------------------------------------------------------------------------------

def test_deploy_readme_states_what_is_untested():
    assert ("The Dockerfile and compose.yaml are untested here: there is no Docker engine on the "
            "development machine. A test parses and validates them statically.") in (DEPLOY / "README.md").read_text()


@pytest.mark.parametrize("prod", [False, True])
def test_each_process_of_the_system_gets_a_metrics_port_of_its_own(prod, tmp_path, monkeypatch):
    """Read by supervisord's own parser, which expands %(process_num)02d: the
    shared service ports answer /metrics from any one process, so each needs
    its own scrape target (chat/metrics_port.py)."""
    from supervisor.options import ServerOptions

    monkeypatch.setenv("CHAT_DAEMON_MONGO_URL", "mongodb://db.example/")
    monkeypatch.setenv("CHAT_DAEMON_MYSQL_URL", "mysql+mysqldb://chat_daemon:pw@db.example/chat")
    options = ServerOptions()
    if prod:
        options.configfile = str(prod_config_copy(tmp_path))
    else:  # %(here)s/var/log must exist
        (tmp_path / "var" / "log").mkdir(parents=True)
        options.configfile = str(shutil.copy(ROOT / "supervisord.conf", tmp_path))
    options.process_config(do_usage=False)
    ports = {p.name: (p.environment or {}).get("CHAT_METRICS_PORT")
             for group in options.process_group_configs for p in group.process_configs
             if p.name.startswith(("api_", "daemon_", "writer", "relay"))}
    assert ports and all(port and port.isdigit() for port in ports.values()), ports
    assert len(set(ports.values())) == len(ports)
    used = {default(f) for f in ("api.port", "daemon.port")}
    assert not used & {int(p) for p in ports.values()}
