"""Who gets what: the map from users to open connections. No I/O, no ``await``.

The stream hands each message here once, already encoded (the JSON payload
and its WebSocket frame, built once for every socket). ``dispatch`` offers it
to every connection of the recipient and of the sender (their other
devices). A connection that is still catching up holds live frames back
until its catch-up frames have gone out in front of them.

A daemon has one hub per partition it serves (``Hubs``), each holding the
connections of that partition's users only, and each fed by that
partition's stream: a message is delivered to a user from the stream of the
user's partition, with no check per message (the sender's copy and the
recipient's copy of a message between two partitions are two messages, one
in each stream).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Final, Protocol

# (message id, JSON payload, WebSocket frame or None to build it on demand)
OutgoingMessage = tuple[int, bytes, bytes | None]


class Sink(Protocol):
    """Where a subscriber's messages go: the I/O shell that holds it (a
    WebSocket's connection, a long-poll's answer)."""

    def send(self, msg_id: int, payload: bytes, frame: bytes | None) -> None:
        """Writes the message now, without waiting."""
        ...

    def overflow(self) -> None:
        """Live messages outgrew their bound while the catch-up ran: what was
        sent is a gap-free prefix, and the shell ends there (a WebSocket closes with 4008)."""
        ...

    def signal(self, payload: bytes) -> None:
        """A typing or presence event (docs/presence.md): no id, never held, never replayed."""
        ...


class _Nowhere:
    """The sink of a subscriber whose shell is gone: nothing more goes out."""

    __slots__ = ()

    def send(self, msg_id: int, payload: bytes, frame: bytes | None) -> None:
        pass

    def overflow(self) -> None:
        pass

    def signal(self, payload: bytes) -> None:
        pass


NOWHERE: Final = _Nowhere()


class Subscriber:
    """One connection's delivery bookkeeping, held by its I/O shell, which is
    its ``sink``: the hub offers each message here, and what is to go out now
    goes to ``sink.send``."""

    __slots__ = ("sink", "user", "partition", "last_id", "pending", "pending_bytes", "overflowed")

    def __init__(self, sink: Sink, user: str, since: int = 0, partition: int = 0):
        self.sink = sink
        self.user = user
        self.partition = partition  # the user's, computed once: the hub it is registered in
        self.last_id = since  # never send an id <= last_id: the per-connection dedup
        self.pending: list[OutgoingMessage] | None = []  # a list while catching up, None once live
        self.pending_bytes = 0
        self.overflowed = False

    def offer(self, msg_id: int, payload: bytes, frame: bytes | None, limit_bytes: int) -> None:
        if self.overflowed:
            return
        if self.pending is None:
            if msg_id > self.last_id:
                self.last_id = msg_id
                self.sink.send(msg_id, payload, frame)
            return
        self.pending_bytes += len(payload)
        if self.pending_bytes > limit_bytes:
            # What is held stays a gap-free prefix: go_live sends it, then the
            # shell closes with 4008 and the client resumes after the last id.
            self.overflowed = True
            return
        self.pending.append((msg_id, payload, frame))

    def send_page(self, catch_up: Iterable[OutgoingMessage]) -> None:
        """Sends one page of a catch-up that has more to come; live frames
        stay held. A long catch-up goes out a page at a time, each once the
        socket has sent most of the one before, so it is never all in memory."""
        send = self.sink.send
        for msg_id, payload, frame in catch_up:
            if msg_id > self.last_id:
                self.last_id = msg_id
                send(msg_id, payload, frame)

    def go_live(self, catch_up: Iterable[OutgoingMessage]) -> None:
        """Sends the (last page of the) catch-up frames (ids <= the stream
        position at register time), then the live frames held meanwhile, each
        id once, in order."""
        pending, self.pending, self.pending_bytes = self.pending or [], None, 0
        self.send_page(itertools.chain(catch_up, pending))
        if self.overflowed:
            self.sink.overflow()

    def detach(self) -> None:
        """Its shell is done (closed, or answered): nothing more goes out, and
        the two no longer hold each other. Held both ways, a closed connection
        that had lived long would wait for a full collection to be freed."""
        self.sink = NOWHERE


class Hub:
    def __init__(self, pending_max_bytes: int):
        self._by_user: dict[str, set[Subscriber]] = {}
        self._limit = pending_max_bytes
        self.count = 0

    def register(self, sub: Subscriber) -> None:
        self._by_user.setdefault(sub.user, set()).add(sub)
        self.count += 1

    def unregister(self, sub: Subscriber) -> None:
        subs = self._by_user.get(sub.user)
        if subs and sub in subs:
            subs.discard(sub)
            self.count -= 1
            if not subs:
                del self._by_user[sub.user]

    def connections_of(self, user: str) -> int:
        return len(self._by_user.get(user, ()))

    def dispatch(self, msg_id: int, sender: str, recipient: str, payload: bytes,
                 encode: Callable[[bytes], bytes]) -> int:
        """Offers the message to the recipient's and the sender's connections; returns how many.
        ``encode`` builds the WebSocket frame, once, and only if this daemon holds a target:
        with N daemons, most messages are for another one."""
        by_user = self._by_user
        recipients = by_user.get(recipient)
        senders = by_user.get(sender) if sender != recipient else None
        # A copy (sending can close a connection, which unregisters it); the two
        # sets never share a connection, which has one user, and neither is ever empty.
        if senders:
            targets = (*recipients, *senders) if recipients else tuple(senders)
        elif recipients:
            targets = tuple(recipients)
        else:
            return 0
        frame, limit = encode(payload), self._limit
        for sub in targets:
            if sub.pending is None and not sub.overflowed:
                # ``Subscriber.offer`` to a live connection, inline: one call fewer for each frame.
                if msg_id > sub.last_id:
                    sub.last_id = msg_id
                    sub.sink.send(msg_id, payload, frame)
            else:
                sub.offer(msg_id, payload, frame, limit)
        return len(targets)


    def signal(self, user: str, payload: bytes, skip: int | None = None) -> int:
        """Writes a typing event to the user's live connections, but the one whose sink has id
        ``skip`` (the typist's own); returns how many. One still catching up gets none: an
        event is news of now, and its hello must come first."""
        sent = 0
        for sub in tuple(self._by_user.get(user, ())):
            if sub.pending is None and not sub.overflowed and id(sub.sink) != skip:
                sub.sink.signal(payload)
                sent += 1
        return sent


class Hubs:
    """A daemon's hubs, one per partition it serves: a subscriber is
    registered in the hub of its user's partition (``Subscriber.partition``)."""

    def __init__(self, by_partition: dict[int, Hub]):
        self.by_partition = by_partition

    def register(self, sub: Subscriber) -> None:
        self.by_partition[sub.partition].register(sub)

    def unregister(self, sub: Subscriber) -> None:
        hub = self.by_partition.get(sub.partition)
        if hub is not None:
            hub.unregister(sub)

    @property
    def count(self) -> int:
        return sum(hub.count for hub in self.by_partition.values())
