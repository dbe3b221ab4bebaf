"""/metrics on a port of one process's own.

The API and daemon processes share their service ports (SO_REUSEPORT), so a
scrape of :8000/metrics or :8100/metrics reaches whichever process the kernel
picks, and Prometheus would read one counter jumping between processes as
resets. Each process therefore also serves its registry on a port of its own,
one scrape target per process. prometheus_client's server runs in a thread:
a scrape never waits on the event loop, nor the loop on a scrape.
"""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

log = logging.getLogger("chat.metrics")


def serve_metrics(host: str, port: int) -> None:
    if port:
        start_http_server(port, addr=host)
        log.info("event=metrics_port port=%d", port)
