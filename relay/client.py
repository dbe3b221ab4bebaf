"""A daemon's oplog tail through the host's relay (relay/server.py).

An ``oplog.events.OplogSource``, as ``oplog.tail.OplogTail`` is, so the
stream cannot tell the two apart: ``batches()`` yields oplog batches in
order, and ``Restarted`` whenever entries may have been missed (the relay
could not resume us from its ring, its own tail re-opened, or we are
reconnecting). The stream needs
nothing more: ids are gap-free, so a missed entry shows up as a hole, or in
the gap check, and is read back from MySQL or the `messages` collection.

Routed by user (``by_user``), it also keeps the set of users the daemon
holds (``want``, ``drop``): their first socket and their last. It sends the
whole set in each hello, so a relay restarted, or a connection dropped,
serves the same users from its ring, and each change as it comes. After
each hello, and after each ``sub`` the relay has applied, it yields a
``Subscribed``: from that point of the stream, the users asked for so far
are served (daemon/interest.py joins a user's catch-up there). It yields
one too each time it finds the relay away: until the next hello, which
names them all, nothing of the relay's comes, and what the stream reads
meanwhile (from MySQL) is whole.

While the relay is away (a restart: about a second under supervisord), the
daemon reconnects every ``RECONNECT_CAP`` seconds at most, and its gap
check delivers what is stored meanwhile. It logs the first failed attempt
at once and then one line every ``UNREACHABLE_LOG_SECONDS`` at most, with
the count of attempts that failed since the line before.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable

from bson import Timestamp
from pymongo import AsyncMongoClient

from oplog.backoff import Backoff
from oplog.events import Batch, OplogEvent, Restarted, Subscribed
from oplog.tail import newest_ts
from relay.protocol import FRAME_MAX, BadFrame, frame, read_frame
from chat.stopping import reraise_if_cancelling

log = logging.getLogger("chat.relay")

RECONNECT_CAP = 1.0
UNREACHABLE_LOG_SECONDS = 5.0


class RepeatedFailures:
    """When a failure that repeats is logged: the first at once, then at most
    one line every ``every`` seconds, standing for the failures since the line
    before. Holds no clock: the caller passes the time."""

    def __init__(self, every: float):
        self.every = every
        self.unlogged = 0  # failures since the last line
        self.quiet_until: float | None = None  # None: no failure since the last success

    def failed(self, now: float) -> int:
        """How many failures a line logged now stands for (this one included), or 0: stay quiet."""
        self.unlogged += 1
        if self.quiet_until is not None and now < self.quiet_until:
            return 0
        self.quiet_until = now + self.every
        count, self.unlogged = self.unlogged, 0
        return count

    def succeeded(self) -> int:
        """The failures that no line counted yet; the next failure is logged at once."""
        count, self.unlogged, self.quiet_until = self.unlogged, 0, None
        return count


class RelayTail:
    def __init__(self, client: AsyncMongoClient, namespace: str | tuple[str, ...], socket_path: str,
                 clock: Callable[[], float] = time.monotonic, by_user: bool = False, name: str = ""):
        """``namespace``: one, or the several a daemon's partitions have (the first is ``namespace``);
        the relay sends the entries of those only. ``clock`` paces the relay_unreachable lines.
        ``by_user``: of those, the entries of the users ``want`` names only; ``name``: this
        daemon in the relay's metrics (its pid by default)."""
        self._client = client
        self._clock = clock
        self._failures = RepeatedFailures(UNREACHABLE_LOG_SECONDS)
        self.namespaces = (namespace,) if isinstance(namespace, str) else tuple(namespace)
        self.namespace = self.namespaces[0]
        self._path = socket_path
        self.last_ts: Timestamp | None = None  # the last entry received: where a reconnect resumes
        self.by_user = by_user
        self.name = name or str(os.getpid())
        self.users: dict[str, set[str]] = {ns: set() for ns in self.namespaces}  # what each hello names
        self._token = 0  # numbers each sub: the relay's ``subbed`` says up to which one applies
        self._writer: asyncio.StreamWriter | None = None  # the connection a sub or unsub goes to, once it said hello

    def want(self, namespace: str, user: str) -> int:
        """Asks for ``user``'s entries of ``namespace`` from now on; returns the
        number that the ``Subscribed`` which serves it carries (or a later one)."""
        self._token += 1
        self.users[namespace].add(user)
        self._request({"sub": [user], "ns": namespace, "n": self._token})
        return self._token

    def drop(self, namespace: str, user: str) -> None:
        """No more of ``user``'s entries of ``namespace``."""
        self.users[namespace].discard(user)
        self._request({"unsub": [user], "ns": namespace})

    def _request(self, message: dict) -> None:
        # Not connected: the next hello names the whole set. A write to a connection
        # that is going is lost with it, and so is covered by that hello as well.
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame(message))

    async def newest_ts(self) -> Timestamp | None:
        return await newest_ts(self._client)

    async def batches(self) -> AsyncIterator[OplogEvent]:
        backoff = Backoff(base=0.05, cap=RECONNECT_CAP)
        codec = self._client.codec_options
        while True:
            writer = None
            try:
                reader, writer = await asyncio.open_unix_connection(self._path)
                hello_frame: dict[str, object] = {"since": self.last_ts, "ns": list(self.namespaces), "name": self.name}
                if self.by_user:
                    hello_frame["users"] = {ns: sorted(users) for ns, users in self.users.items()}
                # The subs numbered up to here are in the hello; later ones go on this connection.
                writer.write(frame(hello_frame))
                in_hello, self._writer = self._token, writer
                hello = await read_frame(reader, FRAME_MAX, codec)
                if hello is None:
                    raise ConnectionError("the relay closed before its hello")
                log.info("event=relay_connected resumed=%s unlogged_failures=%d", hello.get("resumed"),
                         self._failures.succeeded())
                if not hello.get("resumed"):
                    yield Restarted()
                if self.by_user:
                    for ns in self.namespaces:  # what the hello named is served from here on
                        yield Subscribed(ns, in_hello)
                backoff.reset()
                while (message := await read_frame(reader, FRAME_MAX, codec)) is not None:
                    batch = message.get("b")
                    part = message.get("ns")
                    if part is not None and (subbed := message.get("subbed")) is not None:
                        yield Subscribed(part, subbed)
                    elif part is not None and batch is not None:  # routed by user
                        self._resume_after(message["ts"])
                        yield Batch(batch, bytes(message.get("p") or b""), part, message["ts"])
                    elif batch:
                        self._resume_after(batch[-1]["ts"])
                        yield Batch(batch)
                    elif message.get("restarted"):
                        yield Restarted()
                log.warning("event=relay_closed action=reconnect")
            except (OSError, BadFrame) as exc:  # ConnectionError is an OSError
                reraise_if_cancelling()
                failures = self._failures.failed(self._clock())
                if failures:
                    log.warning("event=relay_unreachable error=%s detail=%s failures=%d", exc.__class__.__name__,
                                exc, failures)
            finally:
                self._writer = None
                if writer is not None:
                    writer.close()
            if self.by_user:
                # No relay now: what the stream takes until the next hello comes from
                # MySQL (the gap check, holes), every row whole, and that hello names
                # every user wanted so far. So they are served from this point of the
                # stream: a user's first socket need not wait for a relay that is away.
                for ns in self.namespaces:
                    yield Subscribed(ns, self._token)
            await asyncio.sleep(backoff.next())

    def _resume_after(self, last: Timestamp) -> None:
        """A batch of several namespaces comes as a frame each: resume after the newest."""
        self.last_ts = last if self.last_ts is None or last > self.last_ts else self.last_ts
