"""The cluster's namespaces, links, addresses and ports: a pure plan, made before anything is created.

One bridge in the root namespace joins a veth pair per namespace: the
database namespace (MariaDB, FerretDB, Redis, Toxiproxy), the application hosts and
the edge (nginx). The root namespace keeps the bridge's own address, so the
bench and a user's curl reach every namespace without entering one.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

PREFIX = "chat-"
DB_NS, EDGE_NS = f"{PREFIX}db", f"{PREFIX}edge"
NAMESPACE_PATTERN = re.compile(rf"^{PREFIX}(db|edge|h\d+)$")
BRIDGE = "chatbr0"
VETH_PREFIX = "chv-"  # root-side ends; the namespace end is renamed eth0 inside it

MYSQL_PORT, MONGO_PORT, REDIS_PORT, TOXIPROXY_API_PORT = 3306, 27017, 6379, 8474
# + host number: host 1's proxies are 3311, 27111 and 6311
MYSQL_PROXY_BASE, MONGO_PROXY_BASE, REDIS_PROXY_BASE = 3310, 27110, 6310
DATABASES = ("mysql", "mongo", "redis")  # a host's links, each behind a proxy of its own
API_PORT, DAEMON_PORT_BASE = 8000, 8100  # daemon d of a host listens on 8100 + d
API_METRICS_PORT, WRITER_METRICS_PORT, RELAY_METRICS_PORT, DAEMON_METRICS_BASE = 9000, 9200, 9300, 9100
EDGE_PORT = 80
MIN_HOSTS, MAX_HOSTS = 3, 20


class PlanError(ValueError):
    """A cluster that cannot be built as asked."""


@dataclass(frozen=True)
class Member:
    """One namespace on the bridge."""

    namespace: str
    address: str
    veth: str  # its root-side veth end


@dataclass(frozen=True)
class Proxy:
    """One Toxiproxy proxy: a host's own link to one database (Redis, the signals' carrier, counts as one)."""

    name: str
    host: str  # the application namespace that uses it
    database: str  # one of DATABASES
    listen: str  # address:port in the database namespace
    upstream: str


@dataclass(frozen=True)
class Plan:
    subnet: str
    prefix_len: int
    bridge_address: str
    db: Member
    edge: Member
    hosts: tuple[Member, ...]
    daemons_per_host: int

    @property
    def members(self) -> tuple[Member, ...]:
        return (self.db, self.edge, *self.hosts)

    @property
    def namespaces(self) -> list[str]:
        return [m.namespace for m in self.members]

    def proxies(self) -> list[Proxy]:
        ports = {"mysql": (MYSQL_PROXY_BASE, MYSQL_PORT), "mongo": (MONGO_PROXY_BASE, MONGO_PORT),
                 "redis": (REDIS_PROXY_BASE, REDIS_PORT)}
        out = []
        for number, host in enumerate(self.hosts, start=1):
            for database in DATABASES:
                base, port = ports[database]
                out.append(Proxy(f"{host.namespace}-{database}", host.namespace, database,
                                 f"{self.db.address}:{base + number}", f"{self.db.address}:{port}"))
        return out

    def proxy(self, host: str, database: str) -> Proxy:
        for p in self.proxies():
            if p.host == host and p.database == database:
                return p
        raise PlanError(f"no {database} proxy for {host}")

    def daemon_ports(self) -> list[int]:
        return [DAEMON_PORT_BASE + d for d in range(self.daemons_per_host)]

    @property
    def toxiproxy_api(self) -> str:
        return f"http://{self.db.address}:{TOXIPROXY_API_PORT}"

    @property
    def edge_url(self) -> str:
        return f"http://{self.edge.address}:{EDGE_PORT}"


def make_plan(hosts: int = 3, subnet: str = "10.213.0.0/24", daemons_per_host: int = 2) -> Plan:
    """Addresses: .1 the bridge (root namespace), .2 the databases, .3 the edge, .11 up the hosts."""
    if not MIN_HOSTS <= hosts <= MAX_HOSTS:
        raise PlanError(f"hosts must be {MIN_HOSTS}..{MAX_HOSTS}, not {hosts}")
    if not 1 <= daemons_per_host <= 8:
        raise PlanError(f"daemons per host must be 1..8, not {daemons_per_host}")
    try:
        net = ipaddress.ip_network(subnet)
    except ValueError as exc:
        raise PlanError(f"subnet {subnet!r}: {exc}") from None
    private = (ipaddress.IPv4Network("10.0.0.0/8"), ipaddress.IPv4Network("172.16.0.0/12"))
    if not isinstance(net, ipaddress.IPv4Network) or not any(net.subnet_of(p) for p in private):
        raise PlanError(f"subnet {subnet} must be IPv4 inside 10.0.0.0/8 or 172.16.0.0/12")
    if net.num_addresses < 16 + hosts:
        raise PlanError(f"subnet {subnet} is too small for {hosts} hosts")

    def at(n: int) -> str:
        return str(net.network_address + n)

    def member(name: str, n: int) -> Member:
        return Member(f"{PREFIX}{name}", at(n), f"{VETH_PREFIX}{name}")

    return Plan(subnet=str(net), prefix_len=net.prefixlen, bridge_address=at(1), db=member("db", 2),
                edge=member("edge", 3), hosts=tuple(member(f"h{i}", 10 + i) for i in range(1, hosts + 1)),
                daemons_per_host=daemons_per_host)


def overlaps(plan: Plan, routes: list[str]) -> list[str]:
    """The networks already routed on this machine (``ip -4 route`` destinations) that the plan's subnet overlaps."""
    net = ipaddress.ip_network(plan.subnet)
    clashes = []
    for dest in routes:
        if dest == "default":
            continue
        try:
            other = ipaddress.ip_network(dest, strict=False)
        except ValueError:
            continue
        if other.version == 4 and net.overlaps(other):
            clashes.append(dest)
    return clashes
