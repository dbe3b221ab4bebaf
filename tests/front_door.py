"""A real nginx in front of daemons of different partitions, routed as
deploy/nginx/chat.conf routes them: ``?partition=k`` on /v1/ws and /v1/poll
goes to partition k's daemon; without it, to a first daemon that answers a
user of another partition 421 with the user's partition."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.servers import free_port, stop, wait_port

NGINX = "/usr/sbin/nginx"


def available() -> bool:
    return shutil.which(NGINX) is not None


def render(port: int, root: Path, first: int, by_partition: dict[int, int]) -> str:
    """nginx.conf on 127.0.0.1:``port``: ``first`` and ``by_partition`` are daemon ports."""
    mapping = "\n".join(f'        "{k}" 127.0.0.1:{p};' for k, p in by_partition.items())
    return f"""worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
daemon off;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      close;
    }}
    map $arg_partition $daemon {{
        default 127.0.0.1:{first};
{mapping}
    }}
    server {{
        listen 127.0.0.1:{port};
        location ~ ^/v1/(ws|poll)$ {{
            proxy_pass http://$daemon;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 75s;
            proxy_buffering off;
        }}
    }}
}}
"""


@contextlib.contextmanager
def front_door(first: int, by_partition: dict[int, int]) -> Iterator[str]:
    """Runs nginx; yields its ws:// base URL."""
    root = Path(tempfile.mkdtemp(prefix="chat-front-door-"))
    port = free_port()
    conf = root / "nginx.conf"
    conf.write_text(render(port, root, first, by_partition))
    log = open(root / "nginx.out", "ab")
    proc = subprocess.Popen([NGINX, "-p", str(root), "-c", str(conf)], stdout=log, stderr=log)
    try:
        wait_port(port, 10, proc)
        yield f"ws://127.0.0.1:{port}"
    except BaseException:
        stop(proc)
        log.close()
        raise  # nginx's logs stay behind, for whoever reads the failure
    stop(proc)
    log.close()
    shutil.rmtree(root, ignore_errors=True)
