"""The API process's side of the link to the host's writer process.

``RemoteWriter.submit`` stores one message as ``MessageWriter.submit`` does,
with the same exceptions, so the POST route does not know which it has. One
Unix connection carries every request of the process, matched to its reply
by a sequence number.

While the writer process is away (a restart), a POST waits up to
``wait_seconds`` for it to come back, then gets 503. A request that was sent
and never answered (the writer died, or stayed silent past ``reply_seconds``)
may have been stored: ``WriteOutcomeUnknown``, whose answer tells the client
to retry with the same ``client_msg_id``.

A writer that is stopping says goodbye (protocol.py): new requests go to
the next writer, and the old connection is half-closed and kept until the
old writer has answered what it was sent. Requests in flight on both are
kept apart, so the old connection's end fails only its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from functools import partial

from chat.drafts import Draft
from chat.messages import Message
from chat.write_errors import WriteOutcomeUnknown, WriteUnavailable
from writer import protocol
from writer.protocol import BadFrame

log = logging.getLogger("chat.writer.client")


class WriterUnreachable(WriteUnavailable):
    """The writer process did not take the request (it is away): nothing was stored."""

    kind = "writer_unavailable"

RECONNECT_SECONDS = 0.05  # a restarted writer is back in about a second: find it soon after


Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class RemoteWriter:
    def __init__(self, path: str, *, wait_seconds: float, reply_seconds: float, connect: Connect | None = None):
        self._path = path
        # How a connection is opened (the tests hand over one end of a socketpair each time).
        self._open: Connect = connect or partial(asyncio.open_unix_connection, path)
        self._wait = wait_seconds
        self._reply = reply_seconds
        self._seq = itertools.count(1)
        # seq -> (future, timer, the connection it was sent on)
        self._pending: dict[int, tuple[asyncio.Future, asyncio.TimerHandle, asyncio.StreamWriter]] = {}
        self._stream: asyncio.StreamWriter | None = None
        self._connecting: asyncio.Task | None = None
        self._reading: set[asyncio.Task] = set()  # one per connection: a stopping writer's too, till it has answered

    async def submit(self, draft: Draft) -> tuple[Message, bool]:
        stream = self._stream or await self._connected()
        while stream is not self._stream or stream.is_closing():
            # It said goodbye while this request waited, or its connection is
            # closed and the reader has not said so yet (a killed writer): this
            # request was not sent, so it goes to the next writer. (uvloop
            # raises on a write to a closed transport; asyncio drops it.)
            stream = await self._connected()
        loop = asyncio.get_running_loop()
        seq = next(self._seq)
        future = loop.create_future()
        self._pending[seq] = (future, loop.call_later(self._reply, self._expire, seq), stream)
        stream.write(protocol.request(seq, draft))
        outcome, msg = await future
        return outcome.result(msg)

    async def ready(self, timeout: float) -> bool:
        """The writer process is connected, or answers a connection within ``timeout``."""
        if self._stream is not None:
            return True
        with contextlib.suppress(WriterUnreachable):
            await self._connected(timeout)
            return True
        return False

    async def close(self) -> None:
        for task in (self._connecting, *self._reading):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._stream is not None:
            self._stream.close()
        self._lost(None, "the API process is stopping")

    async def _connected(self, timeout: float | None = None) -> asyncio.StreamWriter:
        # One connecting task, whoever waits for it: a POST waits at most
        # ``wait_seconds`` but the attempts go on for the next POST.
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.create_task(self._connect(), name="writer-connect")
        try:
            return await asyncio.wait_for(asyncio.shield(self._connecting), timeout or self._wait)
        except TimeoutError:
            raise WriterUnreachable("writer: the writer process is not answering") from None

    async def _connect(self) -> asyncio.StreamWriter:
        while True:
            try:
                reader, stream = await self._open()
                break
            except OSError:  # not there yet (restarting), or refusing
                await asyncio.sleep(RECONNECT_SECONDS)
        log.info("event=writer_connected path=%s", self._path)
        self._stream = stream
        reading = asyncio.create_task(self._read(reader, stream), name="writer-replies")
        self._reading.add(reading)
        reading.add_done_callback(self._reading.discard)
        return stream

    async def _read(self, reader: asyncio.StreamReader, stream: asyncio.StreamWriter) -> None:
        reason = "the writer process closed the connection"
        try:
            while (payload := await protocol.read_frame(reader, protocol.REPLY_FRAME_MAX)) is not None:
                seq, outcome, msg = protocol.parse_reply(payload)
                if outcome is None:  # the goodbye
                    self._leave(stream)
                    continue
                pending = self._pending.pop(seq, None)
                if pending is not None:  # None: expired already
                    pending[1].cancel()
                    if not pending[0].done():
                        pending[0].set_result((outcome, msg))
        except (BadFrame, ConnectionError, ValueError, TypeError) as exc:  # Value/Type: a reply of the wrong shape
            reason = f"{exc.__class__.__name__}: {exc}"
        finally:
            stream.close()
            if self._stream is stream:
                self._stream = None
            self._lost(stream, reason)

    def _leave(self, stream: asyncio.StreamWriter) -> None:
        """The writer on ``stream`` is stopping: send the next request elsewhere,
        and tell it this end sent its last one, so it can answer them all and go."""
        log.info("event=writer_stopping path=%s", self._path)
        if self._stream is stream:
            self._stream = None
        with contextlib.suppress(OSError):
            stream.write_eof()

    def _lost(self, stream: asyncio.StreamWriter | None, reason: str) -> None:
        """Every request sent on a lost connection (None: on any) may or may not have been stored."""
        lost = [seq for seq, (_f, _t, sent_on) in self._pending.items() if stream is None or sent_on is stream]
        if lost:
            log.warning("event=writer_connection_lost unanswered=%d reason=%s", len(lost), reason)
        for seq in lost:
            future, timer, _sent_on = self._pending.pop(seq)
            timer.cancel()
            if not future.done():
                future.set_exception(WriteOutcomeUnknown(f"writer: {reason}"))

    def _expire(self, seq: int) -> None:
        future, _timer, _sent_on = self._pending.pop(seq, (None, None, None))
        if future is not None and not future.done():
            log.warning("event=writer_reply_timeout seconds=%.1f", self._reply)
            future.set_exception(WriteOutcomeUnknown("writer: no answer in time"))
