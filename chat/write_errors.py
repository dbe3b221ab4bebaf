"""How a write can fail, as the writer raises it and the API answers it.

The writer of the API process itself and the host's writer process (through
writer/client.py) raise the same exceptions, so the POST route does not know
which one stored its message.
"""

from __future__ import annotations

from chat.errors import ChatError
from chat.messages import Message


class WriteUnavailable(ChatError):
    """MySQL is down, slow or locked past the timeout: nothing was stored."""

    kind = "mysql_unavailable"  # the error code of the API's 503


class PartitionBusy(WriteUnavailable):
    """The partition's writer lock stayed held by another writer (another
    host's) for the whole lock wait: MySQL answered, nothing was stored, and a
    retry goes in once that writer hands the lock over."""

    kind = "partition_busy"


class WriteOutcomeUnknown(WriteUnavailable):
    """MySQL failed during the commit itself and could not be asked afterwards
    whether it took: the messages may be stored. A retry with the same
    client_msg_id returns them if so, and stores them once if not."""


class WriterOverloaded(ChatError):
    """More requests are queued than the writer accepts: nothing was stored."""


class ClientIdConflict(ChatError):
    """The sender reused a client_msg_id for a different message."""

    def __init__(self, original: Message):
        super().__init__("client_msg_id already used for a different message")
        self.original = original


# The one table from a write's failure to the client's answer: (status, error
# code, message, field). The code of a WriteUnavailable is its ``kind``
# (`mysql_unavailable`, `partition_busy`, or `writer_unavailable` from the writer's client).
# Subclasses first: the first class in an exception's MRO found here answers.
ANSWERS: dict[type[ChatError], tuple[int, str | None, str, str | None]] = {
    WriteOutcomeUnknown: (503, "outcome_unknown", "the permanent store failed while committing; the message may "
                          "have been stored: retry with the same client_msg_id", None),
    PartitionBusy: (503, None, "another writer holds this partition's lock; nothing was stored, retry", None),
    WriteUnavailable: (503, None, "the permanent store is unavailable; nothing was stored, retry", None),
    WriterOverloaded: (503, "overloaded", "the permanent store is unavailable; nothing was stored, retry", None),
    ClientIdConflict: (409, "client_msg_id_conflict",
                       "client_msg_id was already used by this sender for a different message", "client_msg_id"),
}


def answer_for(exc: ChatError) -> tuple[int, str, str, str | None]:
    """(status, error code, message, field) of a write's failure, from ``ANSWERS``."""
    for cls in type(exc).__mro__:
        if cls in ANSWERS:
            status, code, message, field = ANSWERS[cls]
            kind: str = getattr(exc, "kind", "mysql_unavailable")
            return status, code or kind, message, field
    raise LookupError(f"no answer for {type(exc).__name__}")

