"""The edge's nginx.conf, generated from the cluster's hosts, daemons and partitions.

Routing (deploy/nginx/chat.conf holds the production site it follows):
  /v1/ws, /v1/poll with ?partition=k -> the daemons that serve partition k, on every host
  /v1/ws, /v1/poll without it         -> every daemon
  anything else with ?partition=k     -> partition k's leading API (host k mod hosts), the
                                         others as backups
  anything else without it            -> every host's API
Each partition has an upstream group of its own; a ``map`` on
``$arg_partition`` picks the group, and ``proxy_pass`` names it through the
variable (an upstream group's name needs no resolver).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chat.partitions import MAX_PARTITIONS
from cluster.partitions import ClusterDaemon, leader_of

ALL_DAEMONS = "chat_daemons_all"


def partition_upstream(partition: int) -> str:
    return f"chat_daemons_p{partition}"


@dataclass(frozen=True)
class EdgePaths:
    """Where this nginx keeps its pid, logs and temporary files (a folder of the cluster's)."""

    root: Path

    @property
    def pid(self) -> Path:
        return self.root / "nginx.pid"

    @property
    def error_log(self) -> Path:
        return self.root / "error.log"

    @property
    def access_log(self) -> Path:
        return self.root / "access.log"


# The daemons' peers are never marked unavailable. nginx's passive check takes a
# failed peer back only once a request to it *ends*, and a WebSocket lasts hours:
# after every daemon restarted at once (a slot move did that), each peer came back
# one client per fail_timeout, and "no live upstreams" answered the rest 502 for
# minutes (docs/decisions/proxy-health-for-websockets.md). A refused or timed-out
# connect is still passed to the next peer (proxy_next_upstream below).
DAEMON_SERVER = "max_fails=0"
# The API's requests are short, so a skipped peer is back at its first answer
# after fail_timeout: a killed host costs one failed connect per 10 s, not one per request.
API_SERVER = "max_fails=1 fail_timeout=10s"
# A connect to a daemon on the LAN takes a millisecond: one without an answer by then is to a host
# that is gone (a killed process refuses at once). With max_fails=0 nothing skips such a host, and
# least_conn ranks it first (it holds no connection), so each new handshake pays this once.
DAEMON_CONNECT_TIMEOUT = "500ms"


def api_upstream(leader: int) -> str:
    return f"chat_api_h{leader}"


def _servers(addresses: list[str], params: str) -> str:
    return "\n".join(f"        server {a} {params};" for a in addresses)


def _led_by(apis: list[str], leader: int) -> str:
    """``apis[leader]`` first, the others only while it is down (nginx's ``backup``)."""
    ordered = apis[leader:] + apis[:leader]
    return "\n".join([f"        server {ordered[0]} {API_SERVER};"]
                     + [f"        server {a} {API_SERVER} backup;" for a in ordered[1:]])


def render(listen: str, apis: list[str], daemons: list[ClusterDaemon], partitions: int, paths: EdgePaths,
           worker_connections: int = 16384, daemon_server: str = DAEMON_SERVER) -> str:
    """``listen``: address:port; ``apis``: address:port of every API; ``daemons``: every daemon and what it serves.
    ``daemon_server``: the parameters of each daemon's ``server`` line (loadtest/proxy_restart.py measures others)."""
    if not apis:
        raise ValueError("no API to route to")
    if not daemons:
        raise ValueError("no daemon to route to")
    groups = [(ALL_DAEMONS, [f"{d.address}:{d.port}" for d in daemons])]
    for k in range(partitions):
        members = [f"{d.address}:{d.port}" for d in daemons if k in d.partitions]
        if not members:
            raise ValueError(f"partition {k} has no daemon")
        groups.append((partition_upstream(k), members))
    upstreams = "\n\n".join(
        f"    upstream {name} {{\n        least_conn;\n{_servers(members, daemon_server)}\n"
        f"        keepalive 32;\n    }}"
        for name, members in groups)
    # The partitions a grow will add are routed already: a daemon's rule (%N=R) says who serves
    # them, the same daemons as one of today's partitions, so the proxy needs no reload.
    routes = {k: partition_upstream(k) for k in range(partitions)}
    by_members: dict[tuple[str, ...], str] = {}
    for name, members in groups[1:]:
        by_members.setdefault(tuple(members), name)
    for k in range(partitions, MAX_PARTITIONS):
        later = tuple(f"{d.address}:{d.port}" for d in daemons if d.serves(k))
        if later in by_members:
            routes[k] = by_members[later]
    mapping = "\n".join(f'        "{k}" {name};' for k, name in routes.items())
    # Writes led per partition: partition k's requests (the client's ?partition=k, the one it
    # connects with) go to one host's API, whose writer leads k (CHAT_WRITER_LEADS, the same
    # rule): it mostly holds k's lock alone, lingers in it while requests come, and makes the
    # copies owed to k. The partition is a hint only: any host stores a request in its sender's.
    api_mapping = "\n".join(f'        "{k}" {api_upstream(leader_of(k, len(apis)))};' for k in range(MAX_PARTITIONS))
    api_upstreams = "\n\n".join(
        f"    upstream {api_upstream(i)} {{\n{_led_by(apis, i)}\n        keepalive 64;\n    }}"
        for i in range(len(apis)))
    daemon_location = f"""
            proxy_pass http://$chat_daemons;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_read_timeout 75s;
            proxy_send_timeout 75s;
            proxy_buffering off;
            # A refused connect, a connect timeout or a 503 (full, draining): the next daemon, up
            # to 3 of them within 3 s.
            proxy_next_upstream error timeout http_503;
            proxy_next_upstream_tries 3;
            proxy_next_upstream_timeout 3s;
            proxy_connect_timeout {DAEMON_CONNECT_TIMEOUT};
            add_header X-Chat-Upstream $upstream_addr always;"""
    return f"""# Generated by cluster/nginx_conf.py for the cluster in network namespaces (docs/cluster.md).
worker_processes 1;
worker_rlimit_nofile 40000;
pid {paths.pid};
error_log {paths.error_log} warn;
daemon off;

events {{
    worker_connections {worker_connections};
    multi_accept on;
}}

http {{
    default_type application/octet-stream;
    server_tokens off;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    client_body_temp_path {paths.root}/client_body;
    proxy_temp_path {paths.root}/proxy;
    # No query string in the access log. Clients send no token in URLs (the daemons refuse
    # one by default), and the error log, which writes the request line whole, would keep it.
    log_format chat '$remote_addr [$time_local] "$request_method $uri" $status $request_time $upstream_addr';
    access_log {paths.access_log} chat buffer=64k flush=2s;

    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      close;
    }}

    # ?partition=k -> that partition's daemons; no (or an unknown) partition -> every daemon
    map $arg_partition $chat_daemons {{
        default {ALL_DAEMONS};
{mapping}
    }}

    # ?partition=k -> the API leading k; no (or an unknown) partition -> every API
    map $arg_partition $chat_api {{
        default chat_api;
{api_mapping}
    }}

{upstreams}

{api_upstreams}

    upstream chat_api {{
{_servers(apis, API_SERVER)}
        keepalive 64;
    }}

    server {{
        listen {listen} reuseport backlog=4096;
        client_max_body_size 16k;

        location = /v1/ws {{{daemon_location}
        }}

        location = /v1/poll {{{daemon_location.replace("$connection_upgrade", '""')}
        }}

        location / {{
            proxy_pass http://$chat_api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_read_timeout 15s;
            proxy_connect_timeout 2s;
            # a POST is passed on only when no byte reached the first API (a dead host)
            proxy_next_upstream error timeout;
            add_header X-Chat-Upstream $upstream_addr always;
        }}
    }}
}}
"""
