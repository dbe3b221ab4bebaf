"""The host's oplog relay: one tail of the oplog for all of the host's daemons.

Every tail costs the database a cursor, and on FerretDB each poll of each
tail re-reads the whole oplog: with a tail per daemon, that cost grows with
the daemons a host runs, and on MongoDB N tails are still N cursors on the
primary for the same entries. The figures: docs/decisions/relay.md.

The relay tails once (oplog/tail.py, the daemon's own tailer), the
collections of every partition there can be, and writes to each daemon
connected to its Unix socket (``CHAT_OPLOG_RELAY_SOCKET``) the entries of
the partitions it asked for in its hello, and no others. A daemon that
routes by user (``CHAT_RELAY_ROUTE_BY_USER``, the default) also says which
users it holds, in its hello and then as their first connection comes and
their last goes; it gets the entries of those users only, and of the rest
the ids (relay/routing.py): each daemon decodes what its sockets need, not
every message of its partitions. Each entry is encoded once, whatever the
number of daemons. It keeps the last ``RING_ENTRIES`` entries, so a daemon that
reconnects (a relay or daemon restart, a slow daemon dropped) with the ``ts``
of the last entry it has resumes without a read of the truth, if the ring
still covers it, cut for the users it holds at its reconnection. A daemon that reads too slowly (more than
``SUBSCRIBER_BUFFER_MAX`` bytes waiting for it) is disconnected rather than
let the relay's memory grow.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from pathlib import Path

import bson
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
from oplog.events import Batch, OplogSource, Restarted
from oplog.namespaces import partition_namespaces, split_by_namespace
from oplog.tail import OplogTail
from oplog.wake import listen_for_wakes
from relay.protocol import HELLO_MAX, REQUEST_MAX, BadFrame, frame, read_frame, slim
from relay.routing import Part, batch_frame, cut, part_of, passed_count

log = logging.getLogger("chat.relay")

RING_ENTRIES = 20_000  # about 20 s at 1,000 msg/s: a daemon restart resumes from here
SUBSCRIBER_BUFFER_MAX = 32 << 20
HELLO_SECONDS = 10.0  # a connection that has not said where it resumes by then is closed

SUBSCRIBERS = Gauge("chat_relay_subscribers", "Daemons connected to the relay")
ENTRIES = Counter("chat_relay_entries_total", "Oplog entries relayed (each once, whatever the daemons)")
DROPPED = Counter("chat_relay_slow_subscribers_total", "Daemons disconnected for reading too slowly")
RESUMES = Counter("chat_relay_resumes_total", "Daemon (re)connections, by whether the ring covered them", ["covered"])
# By the name in the daemon's hello (its pid): a label is removed when its daemon goes.
FORWARDED = Counter("chat_relay_forwarded_total", "Oplog entries written to a daemon, by daemon", ["daemon"])
PASSED_OVER = Counter("chat_relay_passed_over_total",
                      "Message ids a daemon routed by user was told of without their entry (none of its users')",
                      ["daemon"])
USERS = Gauge("chat_relay_users", "Users a daemon routed by user holds, by daemon", ["daemon"])


class Downstream:
    """One daemon connected: what it asked for, and its counters."""

    __slots__ = ("writer", "wanted", "users", "name", "forwarded", "passed", "held")

    def __init__(self, writer: asyncio.StreamWriter, wanted: frozenset[str] | None,
                 users: dict[str, set[str]] | None, name: str):
        self.writer = writer
        self.wanted = wanted  # its namespaces; None: all of them
        self.users = users  # by namespace, the users it holds; None: it takes whole namespaces
        self.name = name
        self.forwarded = FORWARDED.labels(name)
        self.passed = PASSED_OVER.labels(name)
        self.held = USERS.labels(name)
        self.count_users()

    def count_users(self) -> None:
        self.held.set(sum(len(users) for users in (self.users or {}).values()))

    def frames(self, parts: dict[str, Part]) -> bytes:
        """What it gets of one batch's parts."""
        wanted, users = self.wanted, self.users
        if users is None:
            sent = [part for ns, part in parts.items() if wanted is None or ns in wanted]
            self.forwarded.inc(sum(len(part.encoded) for part in sent))
            return b"".join(part.whole for part in sent)
        out = []
        for ns, part in parts.items():
            if wanted is not None and ns not in wanted:
                continue
            entries, passed = cut(part, users.get(ns, ()))
            if entries or passed:
                self.forwarded.inc(len(entries))
                self.passed.inc(passed_count(passed))
                out.append(batch_frame(ns, part.last_ts, entries, passed))
        return b"".join(out)

    def forget_metrics(self) -> None:
        for counter in (FORWARDED, PASSED_OVER, USERS):
            try:
                counter.remove(self.name)
            except KeyError:
                pass


class Relay:
    def __init__(self, tail: OplogSource, codec: CodecOptions, ring_entries: int = RING_ENTRIES,
                 buffer_max: int = SUBSCRIBER_BUFFER_MAX, hello_seconds: float = HELLO_SECONDS):
        self._tail = tail
        self._codec = codec
        # (ts of the batch's last entry, its part per namespace, its entries): oldest first
        self._ring: deque[tuple[Timestamp, dict[str, Part], int]] = deque()
        self._ring_entries, self._ring_max = 0, ring_entries
        # The ring holds every entry after this ts (None: nothing is covered yet).
        self._covered_from: Timestamp | None = None
        self._buffer_max = buffer_max
        self._hello_seconds = hello_seconds
        self._subscribers: dict[asyncio.StreamWriter, Downstream] = {}
        # Set once the tail is open: a daemon that connects from then on, with
        # a ``since`` at or after the tail's start, is resumed from the ring.
        self.ready = asyncio.Event()

    @property
    def subscribers(self) -> int:
        """Daemons connected now."""
        return len(self._subscribers)

    def users_of(self, name: str) -> set[str]:
        """The users the daemon of that name (its hello's) holds, every namespace's; empty if it takes whole ones."""
        return {u for sub in self._subscribers.values() if sub.name == name for users in (sub.users or {}).values()
                for u in users}

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
            if not isinstance(event, Batch):
                continue  # a tail's events are batches and restarts only
            batch = event.entries
            if namespaces is None:
                namespaces = frozenset(getattr(self._tail, "namespaces", None) or (self._tail.namespace,))
            # Each entry encoded once, for every daemon and namespace (a transaction's may be in several).
            encoded = {id(e): bson.encode(slim(e)) for e in batch}
            parts = {ns: part_of(ns, part, [encoded[id(e)] for e in part])
                     for ns, part in split_by_namespace(batch, namespaces).items()}
            ENTRIES.inc(len(batch))
            self._remember(batch[-1]["ts"], parts, len(batch))
            self._publish(parts)

    def _remember(self, last_ts: Timestamp, parts: dict[str, Part], entries: int) -> None:
        self._ring.append((last_ts, parts, entries))
        self._ring_entries += entries
        while self._ring_entries > self._ring_max and len(self._ring) > 1:
            dropped_ts, _, n = self._ring.popleft()
            self._ring_entries -= n
            if self._covered_from is None or dropped_ts > self._covered_from:
                self._covered_from = dropped_ts

    def _publish(self, parts: dict[str, Part]) -> None:
        for writer, subscriber in list(self._subscribers.items()):
            if data := subscriber.frames(parts):
                self._send(writer, data)

    def _send(self, subscriber: asyncio.StreamWriter, data: bytes) -> None:
        if subscriber.transport.get_write_buffer_size() > self._buffer_max:
            log.warning("event=relay_subscriber_slow action=disconnect buffered=%d",
                        subscriber.transport.get_write_buffer_size())
            DROPPED.inc()
            self._drop(subscriber)
            subscriber.transport.abort()
            return
        subscriber.write(data)

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        if (subscriber := self._subscribers.pop(writer, None)) is not None:
            subscriber.forget_metrics()
            SUBSCRIBERS.set(len(self._subscribers))

    def _since(self, since: Timestamp | None, subscriber: Downstream) -> list[bytes] | None:
        """The frames after ``since`` for ``subscriber`` (its namespaces, cut
        for the users of its hello), or None if the ring does not cover it. No
        ``since``: the daemon found the oplog empty, so every entry is after
        it. The batch that ends at ``since`` is sent again: a daemon may have
        had only some of its namespaces' frames (the repeats are dropped by its sequencer)."""
        since = since or Timestamp(0, 0)
        if self._covered_from is None or since < self._covered_from:
            return None
        return [data for last_ts, parts, _ in self._ring if last_ts >= since
                if (data := subscriber.frames(parts))]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One daemon: its hello, what the ring has after its position, then every batch until either side closes."""
        try:
            hello = await asyncio.wait_for(read_frame(reader, HELLO_MAX, self._codec), self._hello_seconds)
            if hello is None:
                return  # connected and left (a check that the relay listens)
            since, wanted, users = hello.get("since"), hello.get("ns"), hello.get("users")
            if not isinstance(since, Timestamp | None):
                raise BadFrame("since is not a Timestamp")
            if wanted is not None and not _strings(wanted):
                raise BadFrame("ns is not a list of namespaces")
            if users is not None and not (isinstance(users, dict) and all(_strings(u) for u in users.values())):
                raise BadFrame("users is not a list of users by namespace")
            name = hello.get("name")
            subscriber = Downstream(writer, None if wanted is None else frozenset(wanted),
                                    None if users is None else {ns: set(u) for ns, u in users.items()},
                                    name if isinstance(name, str) and name else "unnamed")
            backlog = self._since(since, subscriber)
            RESUMES.labels(str(backlog is not None).lower()).inc()
            # No await from here to the subscription: nothing published in between is missed.
            writer.write(frame({"resumed": backlog is not None}))
            for data in backlog or []:
                writer.write(data)
            self._subscribers[writer] = subscriber
            SUBSCRIBERS.set(len(self._subscribers))
            log.info("event=relay_subscribed daemon=%s by_user=%s users=%d resumed=%s backlog_batches=%d",
                     subscriber.name, users is not None, sum(len(u) for u in (subscriber.users or {}).values()),
                     backlog is not None, len(backlog or []))
            if subscriber.users is None:
                if await reader.read(1):  # returns when the daemon goes: it sends nothing after its hello
                    raise BadFrame("bytes after the hello")
                return
            while (request := await read_frame(reader, REQUEST_MAX, self._codec)) is not None:
                self._apply(subscriber, request)
        except (BadFrame, TimeoutError, ConnectionError) as exc:
            log.warning("event=relay_subscriber_refused error=%s detail=%s", exc.__class__.__name__, exc)
        finally:
            self._drop(writer)
            writer.close()

    def _apply(self, subscriber: Downstream, request: dict) -> None:
        """A daemon routed by user takes a user on (``sub``, then the marker
        that says from where in its stream that user's entries come) or lets
        one go (``unsub``). Applied between two batches: each batch is cut for
        one set of users."""
        ns, users = request.get("ns"), request.get("sub", request.get("unsub"))
        if not isinstance(ns, str) or not _strings(users):
            raise BadFrame("a request is {sub|unsub: [users], ns, n}")
        held = subscriber.users.setdefault(ns, set())  # type: ignore[union-attr]  # a daemon routed by user
        named: list[str] = users  # type: ignore[assignment]  # checked by _strings
        if "sub" in request:
            token = request.get("n")
            if not isinstance(token, int):
                raise BadFrame("a sub has no number")
            held.update(named)
            self._send(subscriber.writer, frame({"subbed": token, "ns": ns}))
        else:
            held.difference_update(named)
        subscriber.count_users()

    def close(self) -> None:
        for writer in list(self._subscribers):
            self._drop(writer)
            writer.close()


async def run(settings: Settings) -> None:
    path = Path(settings.relay.socket)
    client: AsyncMongoClient = mongo.make_client(settings.stores.mongo_url.get_secret_value(),
                                                 settings.stores.db_timeout_seconds)
    # Every partition there can be: the relay needs no slot map, and a map
    # that grows needs no relay restart.
    tail = OplogTail(client, *partition_namespaces(settings.stores.mongo_db, list(range(MAX_PARTITIONS))),
                     silence_seconds=settings.tail.silence_seconds,
                     ferretdb_poll_seconds=settings.tail.ferretdb_poll_ms / 1000,
                     ferretdb_idle_poll_seconds=settings.ferretdb_idle_poll_seconds())
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


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
