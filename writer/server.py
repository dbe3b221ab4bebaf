"""The host's writer process: every API process's messages, one group commit.

Ids must reach MongoDB in commit order (writer/message_writer.py), so writers take turns
under a MySQL lock, and each turn ends with a wait for its last Mongo insert.
With a writer in each API process, two processes on one host spent most of a
message's creation time waiting for each other's turn
(docs/decisions/one-writer-per-host.md). Here the API processes
parse, authenticate and validate, and hand the message to this one process
over a Unix socket; it batches them all together and holds the lock, in
turns, only against the writers of other hosts. It runs one writer per
partition (writer/partitioned.py), on the slot map MySQL holds when it starts.

SIGTERM: stop accepting, say goodbye on every link and read each to the end
the API process then gives it, answer every request read (a batch in flight
finishes), then exit. The API processes wait for the next writer
(``CHAT_WRITER_WAIT_SECONDS``), so a restart delays POSTs, and refuses none.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from functools import partial
from pathlib import Path

from chat.messages import Message
from chat.metrics_port import serve_metrics
from chat.settings import Settings
from chat.signal_store import connect
from chat.stopping import bounded, stop_on_signals
from chat.unix_socket import bind_owner_only
from chat.write_errors import ClientIdConflict, Outcome, WriterOverloaded
from db import mongo
from db.partition_map import load_slot_map
from db.sql import make_engine
from oplog.wake import WakePublisher
from writer import metrics, protocol
from writer.echo_wake import EchoWakes, listen_for_echo_wakes
from writer.partitioned import PartitionedWriter, build, engine_pool_size
from writer.protocol import BadFrame

log = logging.getLogger("chat.writer.server")


# Module globals: the outcomes of nearly every reply, looked up fast.
CREATED, REPLAYED, OUTCOME_UNKNOWN = Outcome.CREATED, Outcome.REPLAYED, Outcome.OUTCOME_UNKNOWN


def outcome_of(future: asyncio.Future) -> tuple[Outcome, Message | None]:
    """A settled ``MessageWriter.enqueue`` future as (outcome, message or None)."""
    if future.cancelled():
        return OUTCOME_UNKNOWN, None
    exc = future.exception()
    if exc is None:
        msg, created = future.result()
        return (CREATED if created else REPLAYED), msg
    outcome = Outcome.of_failure(exc)
    if outcome is None:
        log.error("event=writer_unexpected_error error=%r", exc)
        return OUTCOME_UNKNOWN, None  # a bug of ours: the message may have been stored
    return outcome, exc.original if isinstance(exc, ClientIdConflict) else None


class Link:
    """One API process's connection: reads its requests, writes each reply as
    soon as its batch is settled (from the future's callback: no task per message)."""

    def __init__(self, writer: PartitionedWriter, reader: asyncio.StreamReader, stream: asyncio.StreamWriter,
                 unanswered: Unanswered, frame_max: int):
        self._writer, self._reader, self._stream = writer, reader, stream
        self._unanswered = unanswered
        self._frame_max = frame_max

    async def read_requests(self) -> None:
        try:
            while (payload := await protocol.read_frame(self._reader, self._frame_max)) is not None:
                seq, draft = protocol.parse_request(payload)
                try:
                    future = self._writer.enqueue(draft)
                except WriterOverloaded:
                    self._stream.write(protocol.reply(seq, Outcome.OVERLOADED, None))
                    continue
                self._unanswered.add()
                future.add_done_callback(partial(self._answer, seq))
        except BadFrame as exc:
            # Not an API process of ours, or a broken one: drop it. Requests it
            # sent before still get stored, their replies go nowhere.
            log.warning("event=writer_bad_frame reason=%s", exc)
            self._stream.close()
        except ConnectionError:
            self._stream.close()

    def _answer(self, seq: int, future: asyncio.Future) -> None:
        self._unanswered.done()
        if not self._stream.is_closing():
            outcome, msg = outcome_of(future)
            self._stream.write(protocol.reply(seq, outcome, msg))


class Unanswered:
    """Requests read and not answered yet, across links: what a stop waits for."""

    def __init__(self):
        self.count = 0
        self._none = asyncio.Event()
        self._none.set()

    def add(self) -> None:
        self.count += 1
        self._none.clear()

    def done(self) -> None:
        self.count -= 1
        if not self.count:
            self._none.set()

    async def settled(self) -> None:
        await self._none.wait()


async def run(settings: Settings) -> None:
    path = Path(settings.writer.socket)
    url = settings.stores.mysql_url.get_secret_value()
    probe = make_engine(url, settings.stores.db_timeout_seconds, pool_size=1)
    try:
        slot_map = load_slot_map(probe)
    finally:
        probe.dispose()
    engine = make_engine(url, settings.stores.db_timeout_seconds, pool_size=engine_pool_size(slot_map))
    client = mongo.make_client(settings.stores.mongo_url.get_secret_value(), settings.stores.db_timeout_seconds)
    # After each batch in the fast store, a wake for the FerretDB tails that back off while idle (oplog.wake);
    # after a commit that owes copies to a partition another host leads, a wake for that leader's echo watch
    # (writer.echo_wake), to which this process listens for the partitions it leads.
    redis = None
    waker = None
    echo_wakes = None
    if redis_url := settings.stores.redis_url.get_secret_value():
        redis = connect(redis_url, settings.stores.db_timeout_seconds)
        waker = WakePublisher.on_redis(redis)
        echo_wakes = EchoWakes.on_redis(redis)
    writer = build(settings, engine, client[settings.stores.mongo_db], slot_map,
                   on_stored=waker.wake if waker is not None else lambda: None,
                   echoes_owed=echo_wakes.owed if echo_wakes is not None else lambda partition: None)
    writing = asyncio.create_task(writer.run(), name="writer")
    listening = None
    if redis_url and settings.writer.led() is not None:
        listening = asyncio.create_task(listen_for_echo_wakes(
            redis_url, writer.echoes_woken, connect_seconds=settings.stores.db_timeout_seconds), name="echo-wakes")
    unanswered = Unanswered()
    frame_max = protocol.request_frame_max(settings.api.body_max_chars)
    links: dict[asyncio.Task, asyncio.StreamWriter] = {}

    async def accept(reader: asyncio.StreamReader, stream: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # asyncio.start_unix_server runs each connection's callback as a task
        links[task] = stream
        try:
            await Link(writer, reader, stream, unanswered, frame_max).read_requests()
        finally:
            links.pop(task, None)

    stop = stop_on_signals()
    server = await asyncio.start_unix_server(accept, sock=bind_owner_only(path, "writer"))
    gc.freeze()  # what start-up made lives as long as the process: out of the cyclic GC's walks (as in the API)
    metrics.watch_gc()
    serve_metrics(settings.writer.metrics_host, settings.writer.metrics_port)
    log.info("event=writer_started socket=%s partitions=%d epoch=%d", path, slot_map.partitions, slot_map.epoch)
    try:
        await stop.wait()
    finally:
        server.close()
        path.unlink(missing_ok=True)
        streams = list(links.values())
        # Goodbye, then read each link to its end: the API process sends
        # nothing after the goodbye and half-closes, so a request already in
        # the socket is read and answered, not dropped at close.
        for stream in streams:
            stream.write(protocol.GOODBYE)
        if links:
            await asyncio.wait(list(links), timeout=settings.stores.db_timeout_seconds)
        for task in list(links):
            task.cancel()  # a link that never ended its side: read no more
        # Answer every request read; the writer's own timeouts bound this,
        # and the API processes give up on a reply after theirs.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(unanswered.settled(), 3 * settings.stores.db_timeout_seconds)
        log.info("event=writer_stopped unanswered=%d", unanswered.count)
        for stream in streams:
            stream.close()
        writing.cancel()
        if listening is not None:
            listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writing
        if listening is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await listening
        await client.close()
        if redis is not None:
            assert waker is not None and echo_wakes is not None
            await bounded("wake_publish", waker.settled(), settings.stores.db_timeout_seconds, log)
            await bounded("echo_wake_publish", echo_wakes.settled(), settings.stores.db_timeout_seconds, log)
            await redis.aclose()
        writer.close()
        engine.dispose()
