"""Prometheus metrics of the write API, and the ASGI middleware that counts requests."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

from chat import gcpauses
from chat.loop_histogram import LoopHistogram

REQUESTS = Counter("chat_api_requests_total", "HTTP requests answered", ["route", "status"])
LATENCY = Histogram("chat_api_request_seconds", "Time to answer a request", ["route"],
                    buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
ERRORS = Counter("chat_api_errors_total", "Error answers by kind", ["kind"])
BATCH_SIZE = Histogram("chat_api_batch_messages", "Messages per group commit",
                       buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
BATCH_SECONDS = Histogram("chat_api_batch_seconds", "Time of one group commit, from its first request taken to its answers (MySQL; the Mongo insert follows)",
                          buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
# Observed on the event loop for each batch's messages at once (LoopHistogram: no lock, a count).
MONGO_LAG = LoopHistogram("chat_writer_mongo_lag_seconds", "Per message, from its created_at stamp (just before its "
                          "MySQL INSERT) to the return of the Mongo insert that holds it: the commit, the wait for "
                          "the insert ahead, its own insert",
                          buckets=(.0025, .005, .0075, .01, .015, .02, .025, .03, .04, .05, .075, .1, .15, .25, .5, 1,
                                   2.5))
OUTBOX_MESSAGES = Gauge("chat_writer_outbox_messages", "Messages committed to MySQL that the fast store does not "
                        "hold yet (the outbox), as of the writer's last turn")
OUTBOX_AGE = Gauge("chat_writer_outbox_age_seconds", "Age of the oldest message in the outbox (0: empty). Past 10 s "
                   "the writer also logs event=outbox_aging; the daemons deliver those messages from MySQL meanwhile")
GC_PAUSES = Histogram("chat_api_gc_pause_seconds", "Cyclic garbage collector passes, by generation: "
                      "no request is read or answered meanwhile", ["generation"], buckets=gcpauses.BUCKETS)
MESSAGES = Counter("chat_api_messages_total", "Messages stored (created) or replayed (retry)", ["result"])
# The children the hot path (api.post_message) touches, looked up once.
MESSAGES_CREATED, MESSAGES_REPLAYED = MESSAGES.labels("created"), MESSAGES.labels("replayed")
POST_LATENCY = LATENCY.labels("/v1/messages")


def watch_gc() -> None:
    gcpauses.watch(GC_PAUSES)


def observe_outbox(size: int, age_seconds: float) -> None:
    OUTBOX_MESSAGES.set(size)
    OUTBOX_AGE.set(age_seconds)


def observe_batch(size: int, seconds: float) -> None:
    BATCH_SIZE.observe(size)
    BATCH_SECONDS.observe(seconds)


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
