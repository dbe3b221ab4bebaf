"""How a write can end, as the writer raises it and the API answers it (``Outcome``).

The writer of the API process itself and the host's writer process (through
writer/client.py) raise the same exceptions, so the POST route does not know
which one stored its message.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum, unique

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


class EventRefused(ChatError):
    """An event (docs/receipts.md) the writer refused by its rules: nothing was stored."""


class MessageNotFound(EventRefused):
    """The id named is not a message of the caller's stream."""


class NotInConversation(EventRefused):
    """A read marker's message is not between the caller and the peer named."""


class PastNewest(EventRefused):
    """A read marker or ack names an id past the newest of the caller's stream."""


class MessageDeleted(EventRefused):
    """A read marker, edit or delete names a deleted message."""


class NotSender(EventRefused):
    """Only a message's sender edits or deletes it."""


class EditWindowClosed(EventRefused):
    """The message is older than CHAT_EDIT_WINDOW_SECONDS."""


class CopyDeferred(ChatError):
    """An event's copy whose message has no copy in this partition yet: its echo stays, a later drain makes it."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The HTTP answer to a write: its status, and for a failure the error
    code, message, field and Retry-After seconds of the JSON error."""

    status: int
    code: str = ""
    message: str = ""
    field: str | None = None
    retry_after: int | None = None


_UNAVAILABLE = "the permanent store is unavailable; nothing was stored, retry"


@unique
class Outcome(Enum):
    """The one table of a write's outcomes. Each member is the string the host's
    writer process sends for it (writer/protocol.py), and carries the exception
    the API process raises for it (``raises``, with ``reason`` as its text; None:
    stored) and the HTTP answer (``answer``). The code of ``UNAVAILABLE``'s answer
    is the exception's ``kind``: `mysql_unavailable`, or `writer_unavailable`
    from the writer's client."""

    raises: type[ChatError] | None
    reason: str
    answer: Answer

    def __new__(cls, wire: str, raises: type[ChatError] | None, reason: str, answer: Answer) -> Outcome:
        member = object.__new__(cls)
        member._value_ = wire
        member.raises, member.reason, member.answer = raises, reason, answer
        return member

    CREATED = "created", None, "", Answer(201)
    REPLAYED = "replayed", None, "", Answer(200)  # a retry: the original
    CONFLICT = "conflict", ClientIdConflict, "", Answer(
        409, "client_msg_id_conflict", "client_msg_id was already used by this sender for a different message",
        "client_msg_id")
    OVERLOADED = "overloaded", WriterOverloaded, "writer: too many requests queued", Answer(
        503, "overloaded", _UNAVAILABLE, retry_after=1)
    OUTCOME_UNKNOWN = "outcome_unknown", WriteOutcomeUnknown, "mysql: the commit failed and may have taken", Answer(
        503, "outcome_unknown", "the permanent store failed while committing; the message may have been stored: "
        "retry with the same client_msg_id", retry_after=1)
    BUSY = "partition_busy", PartitionBusy, "writer: another writer holds this partition's lock", Answer(
        503, "partition_busy", "another writer holds this partition's lock; nothing was stored, retry", retry_after=1)
    UNAVAILABLE = "unavailable", WriteUnavailable, "mysql: unavailable", Answer(
        503, "", _UNAVAILABLE, retry_after=1)
    # Events refused by their rules (docs/receipts.md, "Errors"): nothing was stored.
    NOT_FOUND = "message_not_found", MessageNotFound, "not a message of your stream", Answer(
        404, "message_not_found", "no message with this id in your stream", "id")
    NOT_IN_CONVERSATION = "not_in_conversation", NotInConversation, "not in this conversation", Answer(
        403, "not_in_conversation", "this message is not between you and peer", "upto")
    PAST_NEWEST = "past_newest", PastNewest, "past the newest id", Answer(
        422, "past_newest", "this id is past the newest of your stream", "upto")
    DELETED = "message_deleted", MessageDeleted, "the message is deleted", Answer(
        409, "message_deleted", "this message is deleted", "id")
    NOT_SENDER = "not_sender", NotSender, "not the sender", Answer(
        403, "not_sender", "only the sender of a message may edit or delete it", "id")
    EDIT_WINDOW = "edit_window_closed", EditWindowClosed, "past the edit window", Answer(
        409, "edit_window_closed", "this message is older than the edit window (CHAT_EDIT_WINDOW_SECONDS)", "id")

    @property
    def wire(self) -> str:
        return self._value_

    @classmethod
    def on_the_wire(cls, wire: object) -> Outcome | None:
        """The outcome a reply names, or None if it names none."""
        return _BY_WIRE.get(wire) if isinstance(wire, str) else None

    @classmethod
    def of_failure(cls, exc: BaseException) -> Outcome | None:
        """The outcome a write's exception is: the first class in its MRO that an
        outcome raises (a subclass before its base). None: no outcome, a bug."""
        for klass in type(exc).__mro__:
            if (outcome := _BY_EXCEPTION.get(klass)) is not None:
                return outcome
        return None

    def result(self, msg: Message | None) -> tuple[Message, bool]:
        """What the API process's ``submit`` returns for this outcome, or raises:
        (message, created), or the outcome's exception."""
        if self.raises is None:
            assert msg is not None, "a stored outcome carries its message"
            return msg, self is _CREATED
        if self.raises is ClientIdConflict:
            assert msg is not None, "a conflict carries the original"
            raise ClientIdConflict(msg)
        raise self.raises(self.reason)


_CREATED = Outcome.CREATED  # a module global: the outcome of nearly every reply, looked up fast
_BY_WIRE: dict[str, Outcome] = {outcome.wire: outcome for outcome in Outcome}
_BY_EXCEPTION: dict[type[BaseException], Outcome] = {o.raises: o for o in Outcome if o.raises is not None}
# The exceptions a write may raise: each is an outcome's, and has its HTTP answer.
WRITE_FAILURES: tuple[type[ChatError], ...] = tuple(o.raises for o in Outcome if o.raises is not None)


def answer_for(exc: ChatError) -> Answer:
    """The HTTP answer to a write's failure, from its ``Outcome``."""
    outcome = Outcome.of_failure(exc)
    if outcome is None or outcome.raises is None:
        raise LookupError(f"no answer for {type(exc).__name__}")
    answer = outcome.answer
    if answer.code:
        return answer
    return replace(answer, code=getattr(exc, "kind", "mysql_unavailable"))
