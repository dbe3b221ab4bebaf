"""A daemon's partitions, at its edge: the slot map it reads when it starts,
one stream and one hub per partition it serves, the one oplog source they
share, and the watch on the map's epoch.

The map is read from MySQL (``db.partition_map``) when the daemon starts;
before ``db.init`` wrote one, and without MySQL
(``CHAT_FILL_HOLES_FROM_MYSQL=false``), it is ``SlotMap.even(CHAT_PARTITIONS)``.
Every move of slots (``chatctl partitions``) raises the epoch, which the
daemon looks at every gap-check period (``next_map``). On a new one it keeps
running: it releases what its partitions have committed, then closes the
clients of the users whose slot moved only (``daemon.handover``). A
partition it is to serve too gets its streams from ``extend``, on an oplog
source of their own: the first source's namespaces are fixed when it is made.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from pymongo import AsyncMongoClient
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from chat.partitions import SlotMap, parse_served
from chat.settings import Settings
from daemon.hub import Hub, Hubs
from daemon.partitioning import frame_encoder
from daemon.stream import Stream
from db.partition_map import newer_slot_map, read_slot_map
from db.sql import make_engine, read_retrying
from db.stream_ranges import StreamRanges
from db.threads import Threads
from oplog.backoff import Backoff
from oplog.events import OplogSource
from oplog.fanout import Fanout
from oplog.namespaces import partition_namespaces
from oplog.tail import OplogTail
from oplog.wake import listen_for_wakes
from relay.client import RelayTail

log = logging.getLogger("chat.daemon")


@dataclass
class Partitions:
    """What a daemon serves: the map, its partitions' streams and hubs, and what runs them."""

    slot_map: SlotMap  # as read at the start (``chat.partitions.LiveMap`` holds the one in force)
    streams: dict[int, Stream]
    hubs: Hubs
    engine: Engine | None  # MySQL: the streams' reads of the truth, the epoch watch
    loops: list[Coroutine[Any, Any, None]] = field(default_factory=list)  # each runs for the daemon's life
    ranges: list[StreamRanges] = field(default_factory=list)
    fanout: Fanout | None = None  # the one source split among several partitions' streams

    @property
    def first(self) -> Stream:
        return self.streams[min(self.streams)]

    def close(self) -> None:
        for ranges in self.ranges:
            ranges.close()
        if self.engine is not None:
            self.engine.dispose()


def _read_map(engine: Engine) -> SlotMap | None:
    with engine.connect() as conn:
        return read_slot_map(conn)


async def load_slot_map(settings: Settings, engine: Engine | None, threads: Threads) -> SlotMap:
    """The map from MySQL, waiting for it to answer (a daemon that guessed
    would serve users another daemon serves); ``even(CHAT_PARTITIONS)``
    before one is written, or without MySQL."""
    if engine is None:
        return SlotMap.even(settings.stores.partitions)
    backoff = Backoff(base=0.5, cap=5.0)
    while True:
        try:
            found = await threads.run(_read_map, engine)
            return found if found is not None else SlotMap.even(settings.stores.partitions)
        except SQLAlchemyError as exc:
            delay = backoff.next()
            log.warning("event=slot_map_unreadable error=%s retry_in_s=%.1f", exc.__class__.__name__, delay)
            await asyncio.sleep(delay)


async def build(settings: Settings, client: AsyncMongoClient, tail: OplogSource | None = None) -> Partitions:
    """Reads the map and makes the streams of the served partitions
    (``CHAT_DAEMON_PARTITIONS``). ``tail``: the replay benchmark's recorded
    entries, for a daemon of one partition."""
    engine = None
    if settings.daemon.fill_holes_from_mysql:  # the engine connects on first use
        engine = make_engine(settings.stores.mysql_url.get_secret_value(), settings.stores.db_timeout_seconds,
                             pool_size=1, reads_only=True)
    threads = Threads(1, "slot-map")
    try:
        slot_map = await load_slot_map(settings, engine, threads)
    finally:
        threads.close()
    served = sorted(parse_served(settings.daemon.partitions, slot_map.partitions))
    if engine is not None and len(served) > 1:  # a connection per partition's reads of the truth
        engine.dispose()
        engine = make_engine(settings.stores.mysql_url.get_secret_value(), settings.stores.db_timeout_seconds,
                             pool_size=len(served), reads_only=True)
    if tail is not None and len(served) != 1:
        raise ValueError("a recorded oplog feeds a daemon of one partition")
    parts = _make(settings, client, served, slot_map, engine, tail, primary=served[0])
    log.info("event=partitions_served served=%s partitions=%d epoch=%d relay=%s", ",".join(map(str, served)),
             slot_map.partitions, slot_map.epoch, bool(settings.relay.socket))
    return parts


def extend(settings: Settings, client: AsyncMongoClient, partitions: frozenset[int], slot_map: SlotMap) -> Partitions:
    """The streams of ``partitions``, which a running daemon is to serve too
    (``daemon.handover``): an oplog source of their own (the first one's
    namespaces are fixed), and a MySQL engine of their own. Not started:
    the caller runs ``loops`` and waits for each stream's ``ready``."""
    served = sorted(partitions)
    engine = None
    if settings.daemon.fill_holes_from_mysql:
        engine = make_engine(settings.stores.mysql_url.get_secret_value(), settings.stores.db_timeout_seconds,
                             pool_size=len(served), reads_only=True)
    parts = _make(settings, client, served, slot_map, engine, None, primary=None)
    log.info("event=partitions_added served=%s partitions=%d epoch=%d relay=%s", ",".join(map(str, served)),
             slot_map.partitions, slot_map.epoch, bool(settings.relay.socket))
    return parts


def _make(settings: Settings, client: AsyncMongoClient, served: list[int], slot_map: SlotMap,
          engine: Engine | None, tail: OplogSource | None, primary: int | None) -> Partitions:
    """The streams and hubs of ``served``, on one oplog source; ``primary``: the
    partition whose position and lag are the daemon's unlabelled gauges."""
    namespaces = partition_namespaces(settings.stores.mongo_db, served)
    loops: list[Coroutine[Any, Any, None]] = []
    sources: dict[int, OplogSource]
    fanout = None
    relay: RelayTail | None = None  # the streams hold their users there, if it routes by user
    if tail is not None:
        sources = {served[0]: tail}
    else:
        shared: OplogTail | RelayTail
        if settings.relay.socket:
            shared = RelayTail(client, tuple(namespaces), settings.relay.socket, by_user=settings.relay.route_by_user)
            relay = shared
        else:
            shared = OplogTail(client, *namespaces, silence_seconds=settings.tail.silence_seconds,
                               ferretdb_poll_seconds=settings.tail.ferretdb_poll_ms / 1000,
                               ferretdb_idle_poll_seconds=settings.ferretdb_idle_poll_seconds())
            if redis_url := settings.stores.redis_url.get_secret_value():  # the writer's wakes (oplog.wake)
                loops.append(listen_for_wakes(redis_url, shared.wake,
                                              connect_seconds=settings.stores.db_timeout_seconds))
        if len(served) == 1:
            sources = {served[0]: shared}
        else:
            fanout = Fanout(shared, namespaces)
            sources = {k: fanout.views[ns] for k, ns in zip(served, namespaces, strict=True)}
            loops.append(fanout.run())
    db = client[settings.stores.mongo_db]
    hubs = {k: Hub(settings.daemon.send_buffer_max_bytes) for k in served}
    ranges = {k: StreamRanges(engine, k) for k in served} if engine is not None else {}
    streams = {k: Stream(db, sources[k], hubs[k], retention_seconds=settings.stores.retention_seconds,
                         cache_max=settings.daemon.recent_cache_max,
                         gap_check_seconds=settings.daemon.gap_check_seconds,
                         cache_max_bytes=settings.daemon.recent_cache_max_bytes, ranges=ranges.get(k), partition=k,
                         encode=frame_encoder(k, slot_map), primary=k == primary, relay=relay,
                         linger_seconds=settings.relay.user_linger_seconds)
               for k in served}
    return Partitions(slot_map, streams, Hubs(hubs), engine, [*loops, *(s.run() for s in streams.values())],
                      list(ranges.values()), fanout)


async def next_map(engine: Engine, epoch: int, period: float) -> SlotMap:
    """The map, once MySQL holds one of a later epoch than ``epoch``: one short
    look-up of the map's epoch each ``period`` (the gap check's). A read that
    fails is passed over: the next one decides."""
    threads = Threads(1, "epoch")

    def read() -> SlotMap | None:
        return read_retrying(engine, lambda conn: newer_slot_map(conn, epoch))

    try:
        while True:
            await asyncio.sleep(period)
            try:
                found = await threads.run(read)
            except SQLAlchemyError as exc:
                log.warning("event=epoch_check_failed error=%s", exc.__class__.__name__)
                continue
            if found is not None:
                return found
    finally:
        threads.close()
