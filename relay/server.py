"""The host's oplog relay: one tail of the oplog for all of the host's daemons.

Every tail costs the database a cursor, and on FerretDB each poll of each
tail re-reads the whole oplog: with a tail per daemon, that cost grows with
the daemons a host runs, and on MongoDB N tails are still N cursors on the
primary for the same entries. The figures: docs/decisions/relay.md.

The relay tails once (oplog/tail.py, the daemon's own tailer), the
collections of every partition there can be, and writes to each daemon
connected to its Unix socket (``CHAT_OPLOG_RELAY_SOCKET``) the entries of
the partitions it asked for in its hello, and no others: a daemon decodes
only its share of the oplog. Each batch is split by namespace and each part
encoded once, whatever the number of daemons. It keeps the last ``RING_ENTRIES`` entries, so a daemon that
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
from chat.partitions import MAX_PARTITIONS
from oplog.events import OplogSource, Restarted
from oplog.namespaces import partition_namespaces, split_by_namespace
from oplog.tail import OplogTail
from oplog.wake import listen_for_wakes
from relay.protocol import HELLO_MAX, BadFrame, frame, read_frame, slim

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
        # (ts of the batch's last entry, its frame per namespace, its entries): oldest first
        self._ring: deque[tuple[Timestamp, dict[str, bytes], int]] = deque()
        self._ring_entries, self._ring_max = 0, ring_entries
        # The ring holds every entry after this ts (None: nothing is covered yet).
        self._covered_from: Timestamp | None = None
        self._buffer_max = buffer_max
        self._hello_seconds = hello_seconds
        # each daemon, and the namespaces it wants (None: all of them)
        self._subscribers: dict[asyncio.StreamWriter, frozenset[str] | None] = {}
        # Set once the tail is open: a daemon that connects from then on, with
        # a ``since`` at or after the tail's start, is resumed from the ring.
        self.ready = asyncio.Event()

    @property
    def subscribers(self) -> int:
        """Daemons connected now."""
        return len(self._subscribers)

    async def run(self) -> None:
        """The tail, for the life of the process. Its first open is a restart
        too: from there on, the ring covers what the tail shows."""
        namespaces: frozenset[str] | None = None  # what the tail reads, once it reads
        async for event in self._tail.batches():
            if isinstance(event, Restarted):
                # Entries before this point may be missing: a daemon resuming
                # from before it must be told so.
                self._covered_from = self._tail.last_ts
                restarted = frame({"restarted": True})
                for subscriber in list(self._subscribers):
                    self._send(subscriber, restarted)
                if not self.ready.is_set():
                    self.ready.set()
                    log.info("event=relay_ready covered_from=%s", self._covered_from)
                continue
            batch = event.entries
            if namespaces is None:
                namespaces = frozenset(getattr(self._tail, "namespaces", None) or (self._tail.namespace,))
            frames = {ns: frame({"b": [slim(e) for e in part]})
                      for ns, part in split_by_namespace(batch, namespaces).items()}
            ENTRIES.inc(len(batch))
            self._remember(batch[-1]["ts"], frames, len(batch))
            self._publish(frames)

    def _remember(self, last_ts: Timestamp, frames: dict[str, bytes], entries: int) -> None:
        self._ring.append((last_ts, frames, entries))
        self._ring_entries += entries
        while self._ring_entries > self._ring_max and len(self._ring) > 1:
            dropped_ts, _, n = self._ring.popleft()
            self._ring_entries -= n
            if self._covered_from is None or dropped_ts > self._covered_from:
                self._covered_from = dropped_ts

    def _publish(self, frames: dict[str, bytes]) -> None:
        for subscriber, wanted in list(self._subscribers.items()):
            if data := for_subscriber(frames, wanted):
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
            del self._subscribers[subscriber]
            SUBSCRIBERS.set(len(self._subscribers))

    def _since(self, since: Timestamp | None, wanted: frozenset[str] | None) -> list[bytes] | None:
        """The frames after ``since`` of the ``wanted`` namespaces, or None if
        the ring does not cover it. No ``since``: the daemon found the oplog
        empty, so every entry is after it. The batch that ends at ``since`` is
        sent again: a daemon may have had only some of its namespaces' frames
        (the repeats are dropped by its sequencer)."""
        since = since or Timestamp(0, 0)
        if self._covered_from is None or since < self._covered_from:
            return None
        return [data for last_ts, frames, _ in self._ring if last_ts >= since
                if (data := for_subscriber(frames, wanted))]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One daemon: its hello, what the ring has after its position, then every batch until either side closes."""
        try:
            hello = await asyncio.wait_for(read_frame(reader, HELLO_MAX, self._codec), self._hello_seconds)
            if hello is None:
                return  # connected and left (a check that the relay listens)
            since, wanted = hello.get("since"), hello.get("ns")
            if not isinstance(since, Timestamp | None):
                raise BadFrame("since is not a Timestamp")
            if wanted is not None and not (isinstance(wanted, list) and all(isinstance(n, str) for n in wanted)):
                raise BadFrame("ns is not a list of namespaces")
            wants = None if wanted is None else frozenset(wanted)
            backlog = self._since(since, wants)
            RESUMES.labels(str(backlog is not None).lower()).inc()
            # No await from here to the subscription: nothing published in between is missed.
            writer.write(frame({"resumed": backlog is not None}))
            for data in backlog or []:
                writer.write(data)
            self._subscribers[writer] = wants
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
    path = Path(settings.relay.socket)
    client: AsyncMongoClient = mongo.make_client(settings.stores.mongo_url.get_secret_value(),
                                                 settings.stores.db_timeout_seconds)
    # Every partition there can be: the relay needs no slot map, and a map
    # that grows needs no relay restart.
    tail = OplogTail(client, *partition_namespaces(settings.stores.mongo_db, list(range(MAX_PARTITIONS))),
                     silence_seconds=settings.tail.silence_seconds,
                     ferretdb_poll_seconds=settings.tail.ferretdb_poll_ms / 1000,
                     ferretdb_idle_poll_seconds=settings.tail.ferretdb_idle_poll_ms / 1000)
    relay = Relay(tail, client.codec_options)
    stop = stop_on_signals()
    tailing = asyncio.create_task(relay.run(), name="relay-tail")
    tailing.add_done_callback(lambda _: stop.set())  # a tail that ends has failed: exit, supervisord restarts
    waking = None
    if redis_url := settings.stores.redis_url.get_secret_value():  # the writer's wakes cut an idle tail's backoff short
        wakes = listen_for_wakes(redis_url, tail.wake, connect_seconds=settings.stores.db_timeout_seconds)
        waking = asyncio.create_task(wakes, name="relay-wakes")
    server = await asyncio.start_unix_server(relay.serve, sock=bind_owner_only(path, "relay"))
    serve_metrics(settings.relay.metrics_host, settings.relay.metrics_port)
    log.info("event=relay_started socket=%s", path)
    try:
        await stop.wait()
    finally:
        server.close()
        path.unlink(missing_ok=True)
        relay.close()  # the daemons reconnect to the next relay and resume from its ring, or fill
        tailing.cancel()  # a no-op if it failed: then its error is kept, not raised here
        if waking is not None:
            waking.cancel()
        await asyncio.gather(tailing, *([waking] if waking else []), return_exceptions=True)
        await client.close()
        log.info("event=relay_stopped")
    if not tailing.cancelled():  # the process exits non-zero with it, and supervisord starts a fresh one
        raise RuntimeError("relay: the tail failed") from tailing.exception()


def for_subscriber(frames: dict[str, bytes], wanted: frozenset[str] | None) -> bytes:
    """What a daemon that wants ``wanted`` (None: all) gets of one batch's frames."""
    if wanted is None:
        return b"".join(frames.values())
    return b"".join(data for ns, data in frames.items() if ns in wanted)
