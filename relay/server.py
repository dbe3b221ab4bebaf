"""The host's oplog relay: one tail of the oplog for all of the host's daemons.

Every tail costs the database a cursor, and on FerretDB each poll of each
tail re-reads the whole oplog. With a tail per daemon, that cost grows with
the daemons a host runs (8 to hold 100k clients under the 20k open-files
limit). At 10k clients and 1,000 msg/s through FerretDB, delivery p50 was
149-195 ms with one daemon tailing against 218-353 ms with two (interleaved
runs). A real MongoDB answers a tail cheaply, but N tails per
host are still N cursors on the primary for the same entries.

The relay tails once (oplog/tail.py, the daemon's own tailer) and writes each batch
to every daemon connected to its Unix socket (``CHAT_OPLOG_RELAY_SOCKET``),
encoded once. It keeps the last ``RING_ENTRIES`` entries, so a daemon that
reconnects (a relay or daemon restart, a slow daemon dropped) with the ``ts``
of the last entry it has resumes without a read of the truth, if the ring
still covers it. A daemon that reads too slowly (more than
``SUBSCRIBER_BUFFER_MAX`` bytes waiting for it) is disconnected rather than
let the relay's memory grow.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path

from bson import Timestamp
from bson.codec_options import CodecOptions
from prometheus_client import Counter, Gauge
from pymongo.asynchronous.mongo_client import AsyncMongoClient

from chat.metrics_port import serve_metrics
from chat.settings import Settings
from chat.stopping import stop_on_signals
from chat.unix_socket import bind_owner_only
from db import mongo
from oplog.events import OplogSource, Restarted
from oplog.tail import OplogTail
from relay.protocol import HELLO_MAX, BadFrame, frame, read_frame

log = logging.getLogger("chat.relay")

RING_ENTRIES = 20_000  # about 20 s at 1,000 msg/s: a daemon restart resumes from here
SUBSCRIBER_BUFFER_MAX = 32 << 20
HELLO_SECONDS = 10.0  # a connection that has not said where it resumes by then is closed

SUBSCRIBERS = Gauge("chat_relay_subscribers", "Daemons connected to the relay")
ENTRIES = Counter("chat_relay_entries_total", "Oplog entries relayed (each once, whatever the daemons)")
DROPPED = Counter("chat_relay_slow_subscribers_total", "Daemons disconnected for reading too slowly")
RESUMES = Counter("chat_relay_resumes_total", "Daemon (re)connections, by whether the ring covered them", ["covered"])


class Relay:
    def __init__(self, tail: OplogSource, codec: CodecOptions, ring_entries: int = RING_ENTRIES,
                 buffer_max: int = SUBSCRIBER_BUFFER_MAX, hello_seconds: float = HELLO_SECONDS):
        self._tail = tail
        self._codec = codec
        # (ts of the batch's last entry, its frame): oldest first
        self._ring: deque[tuple[Timestamp, bytes, int]] = deque()
        self._ring_entries, self._ring_max = 0, ring_entries
        # The ring holds every entry after this ts (None: nothing is covered yet).
        self._covered_from: Timestamp | None = None
        self._buffer_max = buffer_max
        self._hello_seconds = hello_seconds
        self._subscribers: set[asyncio.StreamWriter] = set()

    async def run(self) -> None:
        """The tail, for the life of the process. Its first open is a restart
        too: from there on, the ring covers what the tail shows."""
        async for event in self._tail.batches():
            if isinstance(event, Restarted):
                # Entries before this point may be missing: a daemon resuming
                # from before it must be told so.
                self._covered_from = self._tail.last_ts
                self._publish(frame({"restarted": True}))
                continue
            batch = event.entries
            data = frame({"b": batch})
            ENTRIES.inc(len(batch))
            self._remember(batch[-1]["ts"], data, len(batch))
            self._publish(data)

    def _remember(self, last_ts: Timestamp, data: bytes, entries: int) -> None:
        self._ring.append((last_ts, data, entries))
        self._ring_entries += entries
        while self._ring_entries > self._ring_max and len(self._ring) > 1:
            dropped_ts, _, n = self._ring.popleft()
            self._ring_entries -= n
            if self._covered_from is None or dropped_ts > self._covered_from:
                self._covered_from = dropped_ts

    def _publish(self, data: bytes) -> None:
        for subscriber in list(self._subscribers):
            self._send(subscriber, data)

    def _send(self, subscriber: asyncio.StreamWriter, data: bytes) -> None:
        if subscriber.transport.get_write_buffer_size() > self._buffer_max:
            log.warning("event=relay_subscriber_slow action=disconnect buffered=%d",
                        subscriber.transport.get_write_buffer_size())
            DROPPED.inc()
            self._drop(subscriber)
            subscriber.transport.abort()
            return
        subscriber.write(data)

    def _drop(self, subscriber: asyncio.StreamWriter) -> None:
        if subscriber in self._subscribers:
            self._subscribers.discard(subscriber)
            SUBSCRIBERS.set(len(self._subscribers))

    def _since(self, since: Timestamp | None) -> list[bytes] | None:
        """The frames after ``since``, or None if the ring does not cover it.
        No ``since``: the daemon found the oplog empty, so every entry is after it."""
        since = since or Timestamp(0, 0)
        if self._covered_from is None or since < self._covered_from:
            return None
        return [data for last_ts, data, _ in self._ring if last_ts > since]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One daemon: its hello, what the ring has after its position, then every batch until either side closes."""
        try:
            hello = await asyncio.wait_for(read_frame(reader, HELLO_MAX, self._codec), self._hello_seconds)
            if hello is None:
                return  # connected and left (a check that the relay listens)
            since = hello.get("since")
            if not isinstance(since, Timestamp | None):
                raise BadFrame("since is not a Timestamp")
            backlog = self._since(since)
            RESUMES.labels(str(backlog is not None).lower()).inc()
            # No await from here to the subscription: nothing published in between is missed.
            writer.write(frame({"resumed": backlog is not None}))
            for data in backlog or []:
                writer.write(data)
            self._subscribers.add(writer)
            SUBSCRIBERS.set(len(self._subscribers))
            log.info("event=relay_subscribed resumed=%s backlog_batches=%d", backlog is not None, len(backlog or []))
            if await reader.read(1):  # returns when the daemon goes: it sends nothing after its hello
                raise BadFrame("bytes after the hello")
        except (BadFrame, TimeoutError, ConnectionError) as exc:
            log.warning("event=relay_subscriber_refused error=%s detail=%s", exc.__class__.__name__, exc)
        finally:
            self._drop(writer)
            writer.close()

    def close(self) -> None:
        for subscriber in list(self._subscribers):
            self._drop(subscriber)
            subscriber.close()


async def run(settings: Settings) -> None:
    path = Path(settings.oplog_relay_socket)
    client: AsyncMongoClient = mongo.make_client(settings.mongo_url.get_secret_value(), settings.db_timeout_seconds)
    tail = OplogTail(client, f"{settings.mongo_db}.{mongo.MESSAGES}", silence_seconds=settings.tail_silence_seconds,
                     ferretdb_poll_seconds=settings.ferretdb_tail_poll_ms / 1000)
    relay = Relay(tail, client.codec_options)
    stop = stop_on_signals()
    tailing = asyncio.create_task(relay.run(), name="relay-tail")
    tailing.add_done_callback(lambda _: stop.set())  # a tail that ends has failed: exit, supervisord restarts
    server = await asyncio.start_unix_server(relay.serve, sock=bind_owner_only(path, "relay"))
    serve_metrics(settings.daemon_host, settings.metrics_port)
    log.info("event=relay_started socket=%s", path)
    try:
        await stop.wait()
    finally:
        server.close()
        path.unlink(missing_ok=True)
        relay.close()  # the daemons reconnect to the next relay and resume from its ring, or fill
        tailing.cancel()  # a no-op if it failed: then its error is kept, not raised here
        await asyncio.gather(tailing, return_exceptions=True)
        await client.close()
        log.info("event=relay_stopped")
    if not tailing.cancelled():  # the process exits non-zero with it, and supervisord starts a fresh one
        raise RuntimeError("relay: the tail failed") from tailing.exception()
