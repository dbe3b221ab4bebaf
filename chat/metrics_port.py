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


def serve_metrics(host: str, port: int) -> bool:
    """Serves /metrics on ``port`` (0: none); False if it cannot.

    A port that is taken (another program, a stale process) costs this
    process its own scrape target, not its service: it logs an error that
    names the port and the reason, and carries on. Exiting instead would
    crash-loop under supervisord and take the process's share of the shared
    port with it, for the sake of an auxiliary endpoint."""
    if not port:
        return True
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        log.error("event=metrics_port_failed host=%s port=%d error=%r action=serving_without_metrics_port",
                  host, port, exc.strerror or str(exc))
        return False
    log.info("event=metrics_port port=%d", port)
    return True
