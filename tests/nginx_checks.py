"""What every nginx config of ours must hold in front of the daemons, read from its text:
cluster/nginx_conf.py's output and deploy/nginx/chat.conf are checked alike
(docs/decisions/proxy-health-for-websockets.md).

- No daemon server is ever marked unavailable (``max_fails=0``): nginx takes such a
  server back only once a request to it ends, and a WebSocket lasts hours, so a restart
  of every daemon at once shut clients out for minutes.
- A refused or unanswered connect still goes to the next daemon, within a bounded
  number of tries and time, after a connect timeout fit for a LAN.
"""

from __future__ import annotations

import re

DAEMON_UPSTREAM = re.compile(r"chat_daemons(_\w+)?")
CONNECT_TIMEOUT_MAX_SECONDS = 1.0
NEXT_UPSTREAM_TIMEOUT_MAX_SECONDS = 5.0


def blocks(text: str, header: str) -> list[str]:
    """The bodies of every `header { ... }` block (nested braces allowed)."""
    found, pos = [], 0
    while (at := text.find(header + " {", pos)) != -1:
        start = i = at + len(header) + 2
        depth = 1
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found.append(text[start:i - 1])
        pos = i
    return found


def block(text: str, header: str) -> str:
    (body,) = blocks(text, header)
    return body


def directive(body: str, name: str) -> str:
    return re.search(rf"^\s*{name}\s+([^;]+);", body, re.M).group(1)


def duration(value: str) -> float:
    """An nginx time ("500ms", "3s", "2m", or a bare number of seconds) in seconds."""
    number, unit = re.fullmatch(r"(\d+)(ms|s|m)?", value).groups()
    return int(number) * {"ms": 0.001, "s": 1, "m": 60, None: 1}[unit]


def servers(upstream_body: str) -> list[tuple[str, dict[str, str]]]:
    """Each ``server`` line of an upstream: its address and its ``name=value`` parameters."""
    found = []
    for address, rest in re.findall(r"^\s*server\s+(\S+?)((?:\s+[^;\s]+)*)\s*;", upstream_body, re.M):
        params = dict(p.split("=", 1) if "=" in p else (p, "") for p in rest.split())
        found.append((address, params))
    return found


def upstreams(conf: str) -> dict[str, str]:
    """Each upstream's name and body."""
    return dict(re.findall(r"^\s*upstream\s+(\w+)\s*\{(.*?)\}", conf, re.M | re.S))


def ejecting_daemon_servers(conf: str) -> list[str]:
    """The daemon server lines that nginx's passive check may mark unavailable: a
    ``max_fails`` other than 0 (absent is nginx's default, 1)."""
    return [f"upstream {name}: server {address} max_fails={params.get('max_fails', '1 (the default)')}"
            for name, body in upstreams(conf).items() if DAEMON_UPSTREAM.fullmatch(name)
            for address, params in servers(body) if params.get("max_fails", "1") != "0"]


def daemon_location_problems(location: str) -> list[str]:
    """What a location proxying to the daemons lacks: a failed connect, a connect timeout
    and a 503 passed to the next daemon, a bound on the tries and their time, and a connect
    timeout that a host gone costs a handshake (nginx's default is 60 s)."""
    problems = []
    next_upstream = set(directive(location, "proxy_next_upstream").split()) if "proxy_next_upstream " in location \
        else set()
    if not {"error", "timeout", "http_503"} <= next_upstream:
        problems.append(f"proxy_next_upstream {sorted(next_upstream)} lacks error, timeout or http_503")
    if not re.search(r"^\s*proxy_next_upstream_tries\s+[1-9]\d*;", location, re.M):
        problems.append("no proxy_next_upstream_tries")
    if "proxy_next_upstream_timeout " not in location or not (
            0 < duration(directive(location, "proxy_next_upstream_timeout")) <= NEXT_UPSTREAM_TIMEOUT_MAX_SECONDS):
        problems.append(f"proxy_next_upstream_timeout not in (0, {NEXT_UPSTREAM_TIMEOUT_MAX_SECONDS}] s")
    if "proxy_connect_timeout " not in location or \
            duration(directive(location, "proxy_connect_timeout")) > CONNECT_TIMEOUT_MAX_SECONDS:
        problems.append(f"proxy_connect_timeout unset (60 s) or above {CONNECT_TIMEOUT_MAX_SECONDS} s")
    return problems
