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


@dataclass(frozen=True, slots=True)
class Batch:
    """Oplog entries in the order the oplog holds them (never empty)."""

    entries: list[dict]


@dataclass(frozen=True, slots=True)
class Restarted:
    """The source re-opened and may have missed entries since the last batch.

    Ids are gap-free, so a consumer needs no read of its own here: what was
    missed shows up as a hole in the ids (or in the gap check) and is read
    back from the stores then."""


OplogEvent = Batch | Restarted


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
