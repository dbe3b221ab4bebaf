"""Prometheus metrics of the write API, and the ASGI middleware that counts requests.

The writer's own (group commits, the Mongo lag, the outbox) are in writer/metrics.py.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram

from chat import gcpauses

REQUESTS = Counter("chat_api_requests_total", "HTTP requests answered", ["route", "status"])
LATENCY = Histogram("chat_api_request_seconds", "Time to answer a request", ["route"],
                    buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
ERRORS = Counter("chat_api_errors_total", "Error answers by kind", ["kind"])
GC_PAUSES = Histogram("chat_api_gc_pause_seconds", "Cyclic garbage collector passes, by generation: "
                      "no request is read or answered meanwhile", ["generation"], buckets=gcpauses.BUCKETS)
MESSAGES = Counter("chat_api_messages_total", "Messages stored (created) or replayed (retry)", ["result"])
# The children the hot path (api.post_message) touches, looked up once.
MESSAGES_CREATED, MESSAGES_REPLAYED = MESSAGES.labels("created"), MESSAGES.labels("replayed")
POST_LATENCY = LATENCY.labels("/v1/messages")


def watch_gc() -> None:
    gcpauses.watch(GC_PAUSES)


class MetricsMiddleware:
    """Counts every HTTP request by route template, not by raw path (bounded labels)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            name = getattr(route, "path", "unmatched")
            REQUESTS.labels(name, str(status)).inc()
            LATENCY.labels(name).observe(time.perf_counter() - started)
