"""The users of one partition that a daemon has asked its relay for, and from
where in the stream each is served. Pure: no I/O, no clock
(tests/core/test_passed_over.py, tests/core/test_routed_join.py).

Routed by user (relay/routing.py), a daemon gets the entries of the users
it holds only. So a user's first socket asks the relay for them (``hold``
says so), and its catch-up must join the live stream where the relay
started to serve them, which the relay marks in the stream itself
(``oplog.events.Subscribed``): the consumer reaches the marker, and every id
seen until then (``subscribed``'s ``seen``) came without that user's
entries, every later one with them. That id is the user's ``since``:

- the socket registers as soon as the marker has come, and its catch-up
  covers up to the position, as always (daemon/server.py
  ``Daemon.subscribe``); the ids up to the marker that are not released yet
  are made to come whole first (ids passed over are read back, holes are
  filled whole anyway: ``daemon.stream.Stream.join``), so those of the
  user's go out to it live, in order, past its catch-up;
- the recent cache holds the user's messages after it only: a catch-up
  from further back reads the store (``covered_from``).

The user's last socket closing lets it go (``release``), after a linger
that the caller times: a long-poll client's next poll comes within it and
finds the user served. A user let go and taken again waits for a new marker.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _User:
    holds: int = 0  # sockets (and polls) of the user open, or waiting for the marker
    since: int | None = None  # from past this id on, every entry of the user reaches this daemon
    generation: int = 0  # which release a delayed ``expire`` belongs to


class Interest:
    def __init__(self) -> None:
        self._users: dict[str, _User] = {}
        # The users asked for and not served yet, with their numbers, in the order
        # of those numbers (``asked`` is called as each is given): a marker takes
        # the ones up to its number from the front, and looks at no other. Scanning
        # every user held made a ramp's connects quadratic (a tenth of a daemon's
        # CPU at 15,000 sockets), and so did scanning every user waiting, when a
        # restart's reconnects left thousands waiting, each sub with its marker.
        self._waiting: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._users)

    def users(self) -> list[str]:
        return list(self._users)

    def hold(self, user: str) -> bool:
        """A socket of ``user`` opens; True: the relay is to be asked for the user (``asked`` with its number)."""
        state = self._users.get(user)
        if state is None:
            self._users[user] = _User(holds=1)
            return True
        state.holds += 1
        state.generation += 1  # a let-go that was due is off
        return False

    def asked(self, user: str, token: int) -> None:
        """The relay's number for the subscription of ``user`` just asked for:
        higher than any number given before."""
        self._waiting.pop(user, None)  # kept in the order of the numbers
        self._waiting[user] = token

    def subscribed(self, token: int, seen: int) -> list[str]:
        """The relay applies every subscription numbered up to ``token`` from
        this point of the stream, where the ids seen so far reach ``seen``:
        the users waiting for it are served past ``seen``. Returns them."""
        served = []
        for user, asked in self._waiting.items():
            if asked > token:
                break
            served.append(user)
        for user in served:
            del self._waiting[user]
            self._users[user].since = seen
        return served

    def covered_from(self, user: str) -> int | None:
        """Every entry of ``user`` past this id reaches this daemon (None: not yet, or not held)."""
        state = self._users.get(user)
        return None if state is None else state.since

    def release(self, user: str) -> int | None:
        """A socket of ``user`` closes. The generation to ``expire`` after the
        linger, if it was the user's last; else None."""
        state = self._users.get(user)
        if state is None:
            return None
        state.holds -= 1
        if state.holds > 0:
            return None
        state.generation += 1
        return state.generation

    def expire(self, user: str, generation: int) -> bool:
        """The linger of a last release is over: True, the user is let go (the
        caller tells the relay); False, a socket came back meanwhile."""
        state = self._users.get(user)
        if state is None or state.holds > 0 or state.generation != generation:
            return False
        del self._users[user]
        self._waiting.pop(user, None)
        return True
