"""The cluster's pure parts: the namespace and address plan, the partition ->
daemons assignment, the nginx and supervisord configs, Toxiproxy's request
bodies, /proc parsing. No root needed (nginx -t runs on the generated file)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from chat.partitions import MAX_PARTITIONS, parse_served
from cluster import nginx_conf, supervisor_conf, toxiproxy
from cluster.partitions import (
    assign,
    daemon_partitions,
    leader_of,
    leads_rule,
    partition_of,
    serving,
    writer_lock_names,
)
from cluster.plan import PlanError, make_plan, overlaps
from cluster.procs import cpu_by_role, cpu_ticks_from_stat, role_of
from tests import nginx_checks


# ---- plan ------------------------------------------------------------------------------------
def test_plan_names_and_addresses():
    plan = make_plan(3)
    assert plan.namespaces == ["chat-db", "chat-edge", "chat-h1", "chat-h2", "chat-h3"]
    assert plan.bridge_address == "10.213.0.1"
    assert (plan.db.address, plan.edge.address) == ("10.213.0.2", "10.213.0.3")
    assert [h.address for h in plan.hosts] == ["10.213.0.11", "10.213.0.12", "10.213.0.13"]
    veths = [m.veth for m in plan.members]
    assert len(set(veths)) == len(veths) and all(len(v) + 2 <= 15 for v in veths)  # IFNAMSIZ, with "-i"
    assert plan.edge_url == "http://10.213.0.3:80" and plan.toxiproxy_api == "http://10.213.0.2:8474"


def test_plan_has_a_proxy_per_host_and_database_on_distinct_ports():
    plan = make_plan(4)
    proxies = plan.proxies()
    assert len(proxies) == 12  # MySQL, Mongo and Redis for each of 4 hosts
    assert len({p.listen for p in proxies}) == 12 and len({p.name for p in proxies}) == 12
    h2 = plan.proxy("chat-h2", "mysql")
    assert (h2.name, h2.listen, h2.upstream) == ("chat-h2-mysql", "10.213.0.2:3312", "10.213.0.2:3306")
    assert plan.proxy("chat-h4", "mongo").upstream == "10.213.0.2:27017"
    h3 = plan.proxy("chat-h3", "redis")
    assert (h3.name, h3.listen, h3.upstream) == ("chat-h3-redis", "10.213.0.2:6313", "10.213.0.2:6379")
    # no proxy listens on a database's own port, with the most hosts a plan has
    largest = make_plan(20, "10.213.0.0/24")
    listening = {int(p.listen.rsplit(":", 1)[1]) for p in largest.proxies()}
    assert len(listening) == 60 and not listening & {3306, 27017, 6379, 8474}


def test_every_host_reaches_every_store_through_its_own_proxies():
    from cluster.up import Cluster  # builds nothing until entered

    cluster = Cluster(make_plan(3), extra_env={"CHAT_PRESENCE_DAEMON_TIMEOUT_SECONDS": "4"})
    env = cluster.host_env("chat-h2")
    assert env["CHAT_MYSQL_URL"].startswith(f"mysql+mysqldb://chat:{cluster.mysql_password}@10.213.0.2:3312/chat")
    assert env["CHAT_MONGO_URL"] == "mongodb://10.213.0.2:27112/?directConnection=true"
    assert env["CHAT_REDIS_URL"] == "redis://10.213.0.2:6312/0"
    assert env["CHAT_PRESENCE_DAEMON_TIMEOUT_SECONDS"] == "4"
    assert cluster.admin_redis_url == "redis://10.213.0.2:6379/0"
    banner = cluster.banner()
    assert "Redis 10.213.0.2:6379" in banner and "Redis via 10.213.0.2:6311" in banner


@pytest.mark.parametrize(("hosts", "subnet", "message"), [
    (2, "10.213.0.0/24", "hosts must be 3"),
    (3, "192.168.5.0/24", "inside 10.0.0.0/8 or 172.16.0.0/12"),
    (3, "172.32.0.0/24", "inside 10.0.0.0/8"),
    (3, "10.0.0.0/29", "too small"),
    (3, "not-a-net", "subnet 'not-a-net'"),
])
def test_plan_refuses_what_cannot_be_built(hosts, subnet, message):
    with pytest.raises(PlanError, match=message):
        make_plan(hosts, subnet)


def test_plan_finds_a_clash_with_routed_networks():
    plan = make_plan(3, "10.213.0.0/24")
    assert overlaps(plan, ["default", "192.0.2.0/24", "10.213.0.128/25", "10.0.0.0/8", "fd00::/64"]) == [
        "10.213.0.128/25", "10.0.0.0/8"]
    assert overlaps(plan, ["default", "192.0.2.0/24"]) == []


# ---- partitions ----------------------------------------------------------------------------------
def test_partition_of_is_the_default_slot_map():
    for user in ("alice", "bob", "u-17", "ünïcode"):
        slot = zlib.crc32(user.encode()) % 1024
        assert partition_of(user, 4) == slot * 4 // 1024
        assert partition_of(user, 1) == 0
    counts = [0] * 4
    for i in range(4000):
        counts[partition_of(f"user{i}", 4)] += 1
    assert min(counts) > 800  # spread, not one partition


@pytest.mark.parametrize(("partitions", "expected"), [
    (1, [(0,), (0,)]), (2, [(0,), (1,)]), (3, [(0, 2), (1,)]), (4, [(0, 2), (1, 3)]),
])
def test_daemon_partitions_with_two_daemons_per_host(partitions, expected):
    assert [daemon_partitions(d, 2, partitions) for d in range(2)] == expected


def test_assignment_serves_every_partition_on_every_host():
    hosts = [("chat-h1", "10.0.0.11"), ("chat-h2", "10.0.0.12"), ("chat-h3", "10.0.0.13")]
    for partitions in (1, 2, 4, 7):
        daemons = assign(hosts, 2, partitions, 8100)
        assert len(daemons) == 6
        for k in range(partitions):
            assert {d.host for d in serving(daemons, k)} == {"chat-h1", "chat-h2", "chat-h3"}
        # a host killed leaves every partition served
        for dead in ("chat-h1", "chat-h2", "chat-h3"):
            assert all(any(d.host != dead for d in serving(daemons, k)) for k in range(partitions))
    assert [(d.port, d.name) for d in daemons[:2]] == [(8100, "chat-h1/daemon_0"), (8101, "chat-h1/daemon_1")]


def test_assignment_refuses_a_partition_on_one_host():
    with pytest.raises(ValueError, match="at least 2"):
        assign([("chat-h1", "10.0.0.11")], 2, 2, 8100)
    with pytest.raises(ValueError):
        daemon_partitions(2, 2, 4)


def test_writer_lock_names():
    assert writer_lock_names(0) == ("chat.writer", "chat.writer.next")
    assert writer_lock_names(3) == ("chat.writer.p3", "chat.writer.p3.next")


# ---- nginx -----------------------------------------------------------------------------------------
def _config(tmp_path: Path, partitions: int) -> str:
    hosts = [("chat-h1", "10.0.0.11"), ("chat-h2", "10.0.0.12"), ("chat-h3", "10.0.0.13")]
    daemons = assign(hosts, 2, partitions, 8100)
    apis = [f"{addr}:8000" for _, addr in hosts]
    return nginx_conf.render("10.0.0.3:80", apis, daemons, partitions, nginx_conf.EdgePaths(tmp_path))


def _upstreams(config: str) -> dict[str, list[str]]:
    return {name: re.findall(r"server (\S+) ", body)
            for name, body in re.findall(r"upstream (\w+) \{(.*?)\}", config, re.S)}


def test_nginx_routes_each_partition_to_its_daemons_on_every_host(tmp_path):
    config = _config(tmp_path, 4)
    ups = _upstreams(config)
    assert ups["chat_daemons_p0"] == ups["chat_daemons_p2"] == ["10.0.0.11:8100", "10.0.0.12:8100", "10.0.0.13:8100"]
    assert ups["chat_daemons_p1"] == ups["chat_daemons_p3"] == ["10.0.0.11:8101", "10.0.0.12:8101", "10.0.0.13:8101"]
    assert len(ups["chat_daemons_all"]) == 6
    assert ups["chat_api"] == ["10.0.0.11:8000", "10.0.0.12:8000", "10.0.0.13:8000"]
    mapping = re.search(r"map \$arg_partition \$chat_daemons \{(.*?)\}", config, re.S).group(1)
    routes = re.findall(r'"(\d+)" (\w+);', mapping)
    assert routes[:4] == [(str(k), f"chat_daemons_p{k}") for k in range(4)]
    # the partitions a grow adds are routed already, to the daemons whose rule serves them
    assert routes[4:] == [(str(k), f"chat_daemons_p{k % 2}") for k in range(4, 64)]
    assert "default chat_daemons_all;" in mapping
    assert config.count("proxy_pass http://$chat_daemons;") == 2  # /v1/ws and /v1/poll
    assert "listen 10.0.0.3:80" in config and f"pid {tmp_path}/nginx.pid;" in config


def test_nginx_without_partitions_has_one_group_besides_all(tmp_path):
    ups = _upstreams(_config(tmp_path, 1))
    assert set(ups) == {"chat_daemons_all", "chat_daemons_p0", "chat_api", "chat_api_h0", "chat_api_h1", "chat_api_h2"}
    assert ups["chat_daemons_p0"] == ups["chat_daemons_all"]


def test_nginx_sends_a_partition_s_requests_to_its_leading_api_and_the_others_only_while_it_is_down(tmp_path):
    """One writer mostly holds a partition's lock: it lingers in it while requests come, instead
    of queueing behind the other hosts' writers for every turn (docs/cluster.md)."""
    config = _config(tmp_path, 4)
    ups = nginx_checks.upstreams(config)
    for leader in range(3):
        lines = nginx_checks.servers(ups[f"chat_api_h{leader}"])
        apis = [f"10.0.0.1{1 + (leader + i) % 3}:8000" for i in range(3)]
        assert [address for address, _ in lines] == apis
        assert ["backup" in params for _, params in lines] == [False, True, True]
        assert all(params["max_fails"] == "1" and params["fail_timeout"] == "10s" for _, params in lines)
    mapping = nginx_checks.block(config, "map $arg_partition $chat_api")
    routes = re.findall(r'"(\d+)" (\w+);', mapping)
    # every partition a grow may add has its leader already: k mod hosts
    assert routes == [(str(k), f"chat_api_h{k % 3}") for k in range(64)]
    assert "default chat_api;" in mapping  # no partition (or a stray one): every API, round robin
    location = nginx_checks.block(config, "location /")
    assert "proxy_pass http://$chat_api;" in location
    # a POST goes to a backup only when no byte of it reached the leader (a refused or timed-out connect)
    assert nginx_checks.directive(location, "proxy_next_upstream") == "error timeout"


def test_nginx_refuses_a_partition_without_daemons(tmp_path):
    hosts = [("chat-h1", "10.0.0.11"), ("chat-h2", "10.0.0.12")]
    daemons = assign(hosts, 2, 2, 8100)
    with pytest.raises(ValueError, match="partition 2 has no daemon"):
        nginx_conf.render("10.0.0.3:80", ["10.0.0.11:8000"], daemons, 3, nginx_conf.EdgePaths(tmp_path))
    with pytest.raises(ValueError, match="no API"):
        nginx_conf.render("10.0.0.3:80", [], daemons, 2, nginx_conf.EdgePaths(tmp_path))


def test_nginx_never_shuts_a_daemon_out_and_passes_a_failed_connect_on(tmp_path):
    """docs/decisions/proxy-health-for-websockets.md: after every daemon restarted at once,
    passive health checks shut WebSocket clients out for minutes."""
    config = _config(tmp_path, 4)
    assert nginx_checks.ejecting_daemon_servers(config) == []
    for path in ("/v1/ws", "/v1/poll"):
        location = nginx_checks.block(config, f"location = {path}")
        assert nginx_checks.daemon_location_problems(location) == [], path
    # The API's requests end within seconds: its passive check takes a host back at once.
    api = nginx_checks.servers(nginx_checks.upstreams(config)["chat_api"])
    assert [params for _, params in api] == [{"max_fails": "1", "fail_timeout": "10s"}] * 3


def test_the_check_finds_every_daemon_server_nginx_may_shut_out(tmp_path):
    hosts = [("chat-h1", "10.0.0.11"), ("chat-h2", "10.0.0.12"), ("chat-h3", "10.0.0.13")]
    daemons = assign(hosts, 2, 2, 8100)
    ejecting = nginx_conf.render("10.0.0.3:80", ["10.0.0.11:8000"], daemons, 2, nginx_conf.EdgePaths(tmp_path),
                                 daemon_server="max_fails=1 fail_timeout=10s")
    found = nginx_checks.ejecting_daemon_servers(ejecting)
    assert len(found) == 12  # 6 in chat_daemons_all, 3 in each partition's
    assert found[0] == "upstream chat_daemons_all: server 10.0.0.11:8100 max_fails=1"
    # a server line without max_fails has nginx's default, 1
    defaulted = nginx_conf.render("10.0.0.3:80", ["10.0.0.11:8000"], daemons, 2, nginx_conf.EdgePaths(tmp_path),
                                  daemon_server="weight=1")
    assert nginx_checks.ejecting_daemon_servers(defaulted)[0].endswith("max_fails=1 (the default)")
    assert nginx_checks.daemon_location_problems("proxy_next_upstream error http_503;") == [
        "proxy_next_upstream ['error', 'http_503'] lacks error, timeout or http_503", "no proxy_next_upstream_tries",
        "proxy_next_upstream_timeout not in (0, 5.0] s", "proxy_connect_timeout unset (60 s) or above 1.0 s"]


def test_nginx_t_accepts_the_generated_config(tmp_path):
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.skip("nginx is not installed (scripts/bootstrap.sh installs nginx-light); `nginx -t` not run")
    conf = tmp_path / "nginx.conf"
    conf.write_text(_config(tmp_path, 4).replace("listen 10.0.0.3:80", "listen 127.0.0.1:18080"))
    result = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr


# ---- supervisord -----------------------------------------------------------------------------------
def test_host_supervisord_config(tmp_path):
    daemons = assign([("chat-h1", "10.0.0.11"), ("chat-h2", "10.0.0.12")], 2, 4, 8100)
    spec = supervisor_conf.HostSpec("chat-h1", "10.0.0.11", tmp_path, Path("/repo"), Path("/repo/.venv/bin/python"),
                                    {"CHAT_MYSQL_URL": "mysql+mysqldb://chat:p%w@10.0.0.2:3311/chat",
                                     "CHAT_JWT_SECRET": "s" * 40},
                                    [d for d in daemons if d.host == "chat-h1"], partitions=4, leads="%2=0")
    parser = configparser.RawConfigParser()
    parser.read_string(supervisor_conf.render(spec))
    programs = [s.removeprefix("program:") for s in parser.sections() if s.startswith("program:")]
    assert programs == ["writer", "api", "relay", "daemon_0", "daemon_1"]

    def env(program: str) -> dict[str, str]:
        pairs = re.findall(r'(\w+)="([^"]*)"', parser.get(f"program:{program}", "environment"))
        return dict(pairs)

    d1 = env("daemon_1")
    # a rule, escaped for supervisord: partitions 1 and 3 of 4, and 5 and 7 once grown to 8
    assert d1["CHAT_DAEMON_PORT"] == "8101" and d1["CHAT_DAEMON_PARTITIONS"] == "%%2=1"
    assert parse_served("%2=1", 4) == {1, 3} and parse_served("%2=1", 8) == {1, 3, 5, 7}
    assert d1["CHAT_METRICS_PORT"] == "9101" and d1["CHAT_DAEMON_HOST"] == "10.0.0.11"
    assert d1["CHAT_OPLOG_RELAY_SOCKET"] == str(tmp_path / "run/relay.sock")
    assert env("api")["CHAT_WRITER_SOCKET"] == env("writer")["CHAT_WRITER_SOCKET"] == str(tmp_path / "run/writer.sock")
    assert all(env(p)["CHAT_PARTITIONS"] == "4" for p in programs)
    assert env("writer")["CHAT_MYSQL_URL"] == "mysql+mysqldb://chat:p%%w@10.0.0.2:3311/chat"  # supervisord's escape
    assert parser.get("program:api", "command") == "/repo/.venv/bin/python -m api"
    # the writer leads what the edge sends this host first; no other process reads it
    assert env("writer")["CHAT_WRITER_LEADS"] == "%%2=0"
    assert [p for p in programs if "CHAT_WRITER_LEADS" in env(p)] == ["writer"]


def test_the_partitions_a_host_s_writer_leads_are_those_the_edge_sends_it_first(tmp_path):
    config = _config(tmp_path, 4)  # three hosts
    mapping = dict(re.findall(r'"(\d+)" (chat_api_h\d);', nginx_checks.block(config, "map $arg_partition $chat_api")))
    for host in range(3):
        led = parse_served(leads_rule(host, 3), MAX_PARTITIONS)
        assert led == {int(k) for k, upstream in mapping.items() if upstream == f"chat_api_h{host}"}
        assert all(leader_of(k, 3) == host for k in led)


def test_host_supervisord_config_without_partitions_sets_none(tmp_path):
    daemons = assign([("chat-h1", "10.0.0.11"), ("chat-h2", "10.0.0.12")], 2, 1, 8100)
    spec = supervisor_conf.HostSpec("chat-h1", "10.0.0.11", tmp_path, Path("/r"), Path("/r/py"), {}, daemons[:2])
    assert "PARTITIONS" not in supervisor_conf.render(spec)
    bad = supervisor_conf.HostSpec("chat-h1", "10.0.0.11", tmp_path, Path("/r"), Path("/r/py"), {"CHAT_X": 'a"b'})
    with pytest.raises(ValueError, match="quote"):
        supervisor_conf.render(bad)


# ---- Toxiproxy ---------------------------------------------------------------------------------------
def test_toxiproxy_bodies():
    plan = make_plan(3)
    body = toxiproxy.populate_body(plan.proxies())
    assert body[0] == {"name": "chat-h1-mysql", "listen": "10.213.0.2:3311", "upstream": "10.213.0.2:3306",
                       "enabled": True}
    assert len(body) == 9
    assert body[2] == {"name": "chat-h1-redis", "listen": "10.213.0.2:6311", "upstream": "10.213.0.2:6379",
                       "enabled": True}
    assert toxiproxy.latency_body(2.4) == {"name": "rtt", "type": "latency", "stream": "downstream",
                                           "toxicity": 1.0, "attributes": {"latency": 2, "jitter": 0}}
    assert toxiproxy.enabled_body(False) == {"enabled": False}
    with pytest.raises(ValueError):
        toxiproxy.latency_body(-1)


# ---- processes --------------------------------------------------------------------------------------------
def test_roles_and_cpu_from_proc():
    assert role_of(["/repo/.venv/bin/python", "-m", "daemon"]) == "daemon"
    assert role_of(["/repo/.venv/bin/python", "-m", "db.init"]) is None
    assert role_of(["mariadbd", "--no-defaults"]) == "mysql"
    assert role_of(["/x/.cache/ferretdb/bin/ferretdb", "--handler=sqlite"]) == "ferretdb"
    assert role_of(["nginx: worker process"]) == "nginx"
    assert role_of(["/usr/bin/redis-server 10.213.0.2:6379"]) == "redis"  # the title it gives itself
    assert role_of(["/repo/.venv/bin/python", "/repo/.venv/bin/supervisord", "-n"]) is None
    stat = "4242 (python (x) y) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 1"
    assert cpu_ticks_from_stat(stat) == 175
    before = {1: ("api", 1.0), 2: ("daemon", 2.0)}
    after = {1: ("api", 1.5), 2: ("daemon", 2.25), 3: ("daemon", 0.5)}  # 3 started in between
    used = cpu_by_role(before, after)
    assert used["api"] == 0.5 and used["daemon"] == 0.75 and used["mysql"] == 0.0
