"""The daemon's decisions about typing and presence (docs/presence.md). Pure:
no I/O, and time comes in as arguments, so tests move the clock.

``PresenceTracker`` counts each user's connections here and says when Redis
must hear of a user: on the first connection (announce), and once the grace
after the last one is over with none back (withdraw). A connection that comes
back within the grace cancels the withdrawal, so nothing is sent for it: a
reconnect storm costs no Redis write and no ``last_seen``.

``Watchers`` maps each watched user to the connections watching them.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)

TYPING_PEERS_MAX = 16  # peers one connection's typing gate remembers; past it, the oldest is forgotten


class PresenceTracker:
    """Users with connections on this daemon, and those in their grace."""

    __slots__ = ("grace", "connections", "leaving")

    def __init__(self, grace_seconds: float):
        self.grace = grace_seconds
        self.connections: dict[str, int] = {}
        # user -> (when the grace ends, the wall-clock ms of the last connection's end), in
        # the order they left: the grace is the same for all, so also in order of their end.
        self.leaving: dict[str, tuple[float, int]] = {}

    def arrive(self, user: str) -> bool:
        """A connection of ``user`` opened; True if Redis must be told the user is here."""
        count = self.connections.get(user, 0)
        self.connections[user] = count + 1
        if count:
            return False
        return self.leaving.pop(user, None) is None  # back within the grace: Redis still holds them

    def leave(self, user: str, now: float, wall_ms: int) -> None:
        """A connection of ``user`` closed at ``now`` (monotonic) and ``wall_ms``."""
        count = self.connections.get(user, 0) - 1
        if count > 0:
            self.connections[user] = count
            return
        self.connections.pop(user, None)
        if count == 0:
            self.leaving[user] = (now + self.grace, wall_ms)

    def due(self, now: float) -> list[tuple[str, int]]:
        """The users whose grace is over at ``now``, with their last seen (ms): to withdraw."""
        out: list[tuple[str, int]] = []
        leaving = self.leaving
        for user, (ends, wall_ms) in leaving.items():
            if ends > now:
                break
            out.append((user, wall_ms))
        for user, _ in out:
            del leaving[user]
        return out

    def held(self) -> set[str]:
        """Every user Redis should list on this daemon: connected, or in their grace."""
        return set(self.connections) | set(self.leaving)


class Watchers(Generic[C]):
    """Watched user -> the connections that watch them; each connection's list, to undo it."""

    __slots__ = ("by_user", "lists")

    def __init__(self) -> None:
        self.by_user: dict[str, set[C]] = {}
        self.lists: dict[C, tuple[str, ...]] = {}

    def watch(self, conn: C, users: Iterable[str]) -> tuple[str, ...]:
        """Replaces ``conn``'s list; returns the new one (duplicates dropped, order kept)."""
        self.forget(conn)
        # Interned: the lists of every connection that watches a user hold one string for them,
        # not a copy each (2.9 of the 9.6 KB a 50-user list cost, measured).
        kept = tuple(dict.fromkeys(map(sys.intern, users)))
        if kept:
            self.lists[conn] = kept
            for user in kept:
                self.by_user.setdefault(user, set()).add(conn)
        return kept

    def forget(self, conn: C) -> None:
        for user in self.lists.pop(conn, ()):
            conns = self.by_user.get(user)
            if conns is not None:
                conns.discard(conn)
                if not conns:
                    del self.by_user[user]

    def of(self, user: str) -> tuple[C, ...]:
        return tuple(self.by_user.get(user, ()))
