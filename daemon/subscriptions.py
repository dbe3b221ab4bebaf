"""Which channels one Redis pub/sub connection is to hold, and which Redis has
confirmed. Pure: no I/O (tests/core/test_subscriptions.py); the shell is
daemon/signals.py.

A daemon listens to a channel per watched user (``chat:presence:{user}``),
so that a presence change is read only by the daemons whose connections watch
that user, not by every daemon. The set of channels changes with every watch
list, so the connection subscribes and unsubscribes as it goes, and a watch's
snapshot is read only once Redis has confirmed the subscription of each of its
users: what is published from then on reaches the daemon, so nothing falls
between the snapshot and the changes after it.

Redis answers each SUBSCRIBE of a channel with one confirmation, in the order
the commands were sent, and a second SUBSCRIBE of a channel already held is
confirmed too. So a channel is held once every SUBSCRIBE sent for it has its
confirmation: after ``SUBSCRIBE a, UNSUBSCRIBE a, SUBSCRIBE a`` the first
confirmation does not mean ``a`` is held, the second one does.

What the connection should hold is the caller's (``wanted``); this only
remembers which channels changed (``touch``) and plans the commands that
bring Redis there, so an unwatch and a watch of the same user between two
plans send nothing at all.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable


def commands(channels: list[str], most: int) -> list[list[str]]:
    """``channels`` as SUBSCRIBE (or UNSUBSCRIBE) commands of at most ``most`` each, in order:
    a new connection of a daemon whose clients watch many users sends several bounded commands,
    not one of every channel. None for no channel: an UNSUBSCRIBE of none lets go of them all."""
    return [channels[start:start + most] for start in range(0, len(channels), most)]


class Subscriptions:
    __slots__ = ("sent", "unconfirmed", "dirty", "_waits", "_left")

    def __init__(self) -> None:
        self.sent: set[str] = set()  # SUBSCRIBE sent on this connection, and no UNSUBSCRIBE since
        self.unconfirmed: dict[str, int] = {}  # channel -> its SUBSCRIBEs not yet confirmed
        self.dirty: set[str] = set()  # channels whose wanting may have changed since the last plan
        self._waits: dict[str, list[Hashable]] = {}  # channel -> the waits that need it held
        self._left: dict[Hashable, set[str]] = {}  # wait -> its channels not yet held

    def reset(self, wanted: Iterable[str]) -> None:
        """A new connection: nothing is held on it, and every channel wanted is to be subscribed.
        Waits stay, and end as their channels are confirmed on the new connection."""
        self.sent.clear()
        self.unconfirmed.clear()
        self.dirty = set(wanted)

    def touch(self, channels: Iterable[str]) -> None:
        """Whether these channels are wanted may have changed: the next plan looks at them."""
        self.dirty.update(channels)

    def plan(self, wanted: Callable[[str], bool]) -> tuple[list[str], list[str], list[Hashable]]:
        """(channels to SUBSCRIBE, channels to UNSUBSCRIBE, waits now over), for the channels
        touched since the last plan, as if both commands were sent now. A wait on a channel
        let go is over: nobody watches it any more, so nothing is left to wait for."""
        subscribe: list[str] = []
        unsubscribe: list[str] = []
        over: list[Hashable] = []
        for channel in self.dirty:
            if wanted(channel):
                if channel not in self.sent:
                    self.sent.add(channel)
                    self.unconfirmed[channel] = self.unconfirmed.get(channel, 0) + 1
                    subscribe.append(channel)
            elif channel in self.sent:
                self.sent.discard(channel)
                unsubscribe.append(channel)
                over += self._held(channel)
        self.dirty.clear()
        return subscribe, unsubscribe, over

    def confirmed(self, channel: str) -> list[Hashable]:
        """Redis confirmed a SUBSCRIBE of ``channel``; returns the waits this ends."""
        left = self.unconfirmed.get(channel, 0) - 1
        if left > 0:
            self.unconfirmed[channel] = left
            return []
        self.unconfirmed.pop(channel, None)
        return self._held(channel) if channel in self.sent else []

    def held(self, channel: str) -> bool:
        """Whether what is published on ``channel`` from now on reaches this connection."""
        return channel in self.sent and channel not in self.unconfirmed

    def wait(self, key: Hashable, channels: Iterable[str]) -> bool:
        """Registers ``key`` to end once each of ``channels`` is held; False if they all are already."""
        left = {channel for channel in channels if not self.held(channel)}
        for channel in left:
            self._waits.setdefault(channel, []).append(key)
        if left:
            self._left[key] = left
        return bool(left)

    def drop(self, key: Hashable) -> None:
        """A wait given up (timed out): forgotten."""
        for channel in self._left.pop(key, ()):
            keys = self._waits[channel]
            keys.remove(key)
            if not keys:
                del self._waits[channel]

    def _held(self, channel: str) -> list[Hashable]:
        over = []
        for key in self._waits.pop(channel, ()):
            left = self._left[key]
            left.discard(channel)
            if not left:
                del self._left[key]
                over.append(key)
        return over
