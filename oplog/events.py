"""What an oplog source hands its consumer, and the interface every source
shares: the tail of the oplog (``oplog.tail.OplogTail``), the relay's client
(``relay.client.RelayTail``) and the replay benchmark's recorded entries.

One small object per batch, nothing per entry: the stream's hot path reads
``batch.entries`` once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from bson import Timestamp

# What a consumer reads of an oplog entry: op, ns and o (chat.messages.inserted_docs, an
# applyOps entry's inner entries included) and ts (where it resumes). The tail asks the
# server for these only (``oplog.tail.ENTRY_PROJECTION``) and the relay forwards these
# only (``relay.protocol.slim``): an entry's other fields (FerretDB's ObjectId _id, the
# `wall` datetime, MongoDB's ui, and a retryable write's lsid, txnNumber, stmtId and
# prevOpTime) cost each reader their decode and read nothing.
ENTRY_FIELDS = ("op", "ns", "o", "ts")


@dataclass(frozen=True, slots=True)
class Batch:
    """Oplog entries in the order the oplog holds them (never empty, but for
    a relay's batch routed by user, whose ``passed`` may be all there is).

    Through a relay that routes by user (relay/routing.py) a batch is one
    namespace's part of an oplog batch: the entries for this daemon's users,
    and ``passed``, the ids (with their digests) of the other message
    documents of that part, which the daemon counts as seen without decoding
    them: (id, digest) pairs packed as ``relay.routing.PASSED``."""

    entries: list[dict]
    passed: bytes = b""
    namespace: str | None = None  # set on a relay's batch of one namespace
    ts: Timestamp | None = None  # the ts of the part's last entry, forwarded to this daemon or not

    @property
    def last_ts(self) -> Timestamp:
        """Where a tail that has handled this batch resumes."""
        return self.ts if self.ts is not None else self.entries[-1]["ts"]


@dataclass(frozen=True, slots=True)
class Restarted:
    """The source re-opened and may have missed entries since the last batch.

    Ids are gap-free, so a consumer needs no read of its own here: what was
    missed shows up as a hole in the ids (or in the gap check) and is read
    back from the stores then."""


@dataclass(frozen=True, slots=True)
class Subscribed:
    """A relay that routes by user has applied this daemon's subscriptions
    of ``namespace`` numbered up to ``token``: from here on in the stream,
    every entry of those users comes (relay/client.py ``RelayTail.want``)."""

    namespace: str
    token: int


OplogEvent = Batch | Restarted | Subscribed


class OplogSource(Protocol):
    """A tail of one namespace of the oplog, resumable from ``last_ts``."""

    namespace: str
    last_ts: Timestamp | None  # the last entry handed on: where a re-open resumes

    async def newest_ts(self) -> Timestamp | None:
        """The ``ts`` of the oplog's newest entry: where a tail from "now" starts."""
        ...

    def batches(self) -> AsyncIterator[OplogEvent]:
        """Batches in oplog order, and ``Restarted`` wherever entries may be missing; never ends."""
        ...
