"""Prometheus metrics of a delivery daemon."""

import os

from prometheus_client import Counter, Gauge, Histogram

from chat import gcpauses
from chat.loop_histogram import LoopHistogram

# Several daemons share one port: the pid label tells their scrapes apart.
INFO = Gauge("chat_daemon_info", "One per daemon process", ["pid"])
INFO.labels(str(os.getpid())).set(1)

CONNECTIONS = Gauge("chat_daemon_connections", "Open WebSocket connections and waiting polls", ["kind"])
# The children the hot paths touch, looked up once (labels() costs a lock and a dict lookup per call).
WS_OPEN, POLLS_WAITING = CONNECTIONS.labels("ws"), CONNECTIONS.labels("poll")
PUSHES = Counter("chat_daemon_pushes_total",
                 "Messages handed to connections: written to a WebSocket at once, or to a poll answer")
OPLOG_ENTRIES = Counter("chat_daemon_oplog_entries_total", "Oplog entries read")
TAIL_BACKPRESSURE = Counter("chat_daemon_tail_backpressure_total",
                            "Times the oplog reader waited for the consumer (overload: delivery slows, none is shed)")
# Only the served partitions' entries reach a daemon (the relay, or its own
# tail, filters the rest out), so each daemon decodes its share of the oplog.
OPLOG_DECODED = Counter("chat_daemon_oplog_entries_decoded_total",
                        "Oplog entries this daemon decoded, by the partition they belong to", ["partition"])
# Routed by user (relay/routing.py): the ids of the partition's other messages, counted
# without decoding them. A daemon's decoded share is decoded / (decoded + passed over).
OPLOG_PASSED = Counter("chat_daemon_oplog_ids_passed_over_total",
                       "Message ids of the partition the relay passed over (for none of this daemon's users), "
                       "by partition", ["partition"])
PARTITION_POSITION = Gauge("chat_daemon_partition_position", "Highest message id released, by partition",
                           ["partition"])
PARTITION_TAIL_LAG = Gauge("chat_daemon_partition_tail_lag_seconds",
                           "Now minus created_at of the newest message released, by partition", ["partition"])
OPLOG_TO_SOCKET = LoopHistogram(
    "chat_daemon_oplog_to_socket_seconds", "Oplog entry received -> frame written to the socket",
    buckets=(.00025, .0005, .001, .002, .003, .004, .005, .0075, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
# These two follow the daemon's first served partition (the single stream's, with one).
TAIL_LAG = Gauge("chat_daemon_tail_lag_seconds", "Now minus created_at of the newest message released")
POSITION = Gauge("chat_daemon_stream_position", "Highest message id released")
CATCHUP_QUERIES = Counter("chat_daemon_catchups_total", "Catch-ups and hole fills by source", ["source"])
CATCHUPS_FROM_CACHE = CATCHUP_QUERIES.labels("cache")
STRAYS = Counter("chat_daemon_stray_documents_total", "Documents of the fast store skipped as not the writer's: "
                 "not in its shape, or past the head MySQL has committed", ["reason"])
SIGNALS = Counter("chat_daemon_signals_total", "Typing and presence events, by kind and what became of them "
                  "(published, received, throttled, dropped)", ["kind", "outcome"])
SIGNAL_FRAMES = Counter("chat_daemon_signal_frames_total", "Typing events written to connections")
PRESENCE_CHANNELS = Gauge("chat_daemon_presence_channels", "Users whose presence channel this daemon subscribes to: "
                          "those its connections watch")
CLOSES = Counter("chat_daemon_closes_total", "Connections closed by the server, by reason", ["reason"])
REJECTS = Counter("chat_daemon_rejects_total", "Handshakes refused, by reason", ["reason"])
GC_PAUSES = Histogram(
    "chat_daemon_gc_pause_seconds", "Cyclic garbage collector passes, by generation: nothing is delivered meanwhile",
    ["generation"], buckets=gcpauses.BUCKETS)


def watch_gc() -> None:
    """Times every collection. With two objects per cached message, a full
    one took 50-160 ms at 10k connections (daemon.stream)."""
    gcpauses.watch(GC_PAUSES)
