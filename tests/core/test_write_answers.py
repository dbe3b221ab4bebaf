"""The one table of a write's outcomes (chat.write_errors.Outcome): the failure's
HTTP answer, and the way each outcome crosses the writer process's socket."""

import asyncio

import orjson
import pytest

from chat.errors import ChatError
from chat.messages import Message, now_ms
from chat.write_errors import (
    ClientIdConflict,
    Outcome,
    PartitionBusy,
    WriteOutcomeUnknown,
    WriterOverloaded,
    WriteUnavailable,
    answer_for,
)
from writer import protocol
from writer.server import outcome_of

MSG = Message(7, "alice", "bob", "hi", now_ms(), "c-1")


class _WriterAway(WriteUnavailable):
    kind = "writer_unavailable"


@pytest.mark.parametrize(("exc", "status", "code", "field"), [
    (WriteOutcomeUnknown("commit failed"), 503, "outcome_unknown", None),  # before its base class
    (PartitionBusy("held elsewhere"), 503, "partition_busy", None),  # the same
    (WriteUnavailable("mysql down"), 503, "mysql_unavailable", None),
    (_WriterAway("restarting"), 503, "writer_unavailable", None),  # the code is the kind
    (WriterOverloaded(), 503, "overloaded", None),
    (ClientIdConflict(MSG), 409, "client_msg_id_conflict", "client_msg_id"),
])
def test_each_failure_has_its_answer(exc, status, code, field):
    answer = answer_for(exc)
    assert (answer.status, answer.code, answer.field) == (status, code, field)
    assert answer.message
    assert answer.retry_after == (1 if status == 503 else None)  # a 503 says when to retry


def test_a_failure_without_an_answer_is_a_bug_not_a_guess():
    with pytest.raises(LookupError):
        answer_for(ChatError("unknown"))


def test_each_outcome_has_a_wire_string_of_its_own():
    wires = [outcome.wire for outcome in Outcome]
    assert len(set(wires)) == len(wires)
    assert protocol.STOPPING not in wires  # the goodbye is no outcome


def _settled(outcome: Outcome) -> tuple[asyncio.Future, ChatError | None]:
    """A writer's future settled as ``outcome``, and the exception it was settled with."""
    future = asyncio.get_running_loop().create_future()
    if outcome.raises is None:
        future.set_result((MSG, outcome is Outcome.CREATED))
        return future, None
    exc = ClientIdConflict(MSG) if outcome.raises is ClientIdConflict else outcome.raises("on the writer's side")
    future.set_exception(exc)
    return future, exc


@pytest.mark.parametrize("outcome", list(Outcome), ids=[o.name for o in Outcome])
async def test_every_outcome_round_trips_from_the_writer_to_the_http_answer(outcome):
    future, failure = _settled(outcome)
    sent, msg = outcome_of(future)  # the writer process encodes
    assert sent is outcome
    frame = protocol.reply(41, sent, msg)
    seq, got, got_msg = protocol.parse_reply(orjson.loads(frame[protocol.HEADER.size:]))  # the API decodes
    assert (seq, got) == (41, outcome)
    if failure is None:
        assert got.result(got_msg) == (MSG, outcome is Outcome.CREATED)
        assert outcome.answer.status == (201 if outcome is Outcome.CREATED else 200)
        return
    with pytest.raises(ChatError) as raised:
        got.result(got_msg)  # what RemoteWriter.submit raises
    assert type(raised.value) is type(failure)  # the same exception as in the writer process
    answer = answer_for(raised.value)
    assert answer == answer_for(failure)  # the same HTTP answer
    assert (answer.status, answer.message) == (outcome.answer.status, outcome.answer.message)
    if outcome is Outcome.CONFLICT:
        assert raised.value.original == MSG
