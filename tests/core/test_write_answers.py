"""The one table from a write's failure to the client's answer (chat.write_errors)."""

import pytest

from chat.messages import Message, now_ms
from chat.write_errors import ClientIdConflict, WriteOutcomeUnknown, WriterOverloaded, WriteUnavailable, answer_for


class _WriterAway(WriteUnavailable):
    kind = "writer_unavailable"


@pytest.mark.parametrize(("exc", "status", "code", "field"), [
    (WriteOutcomeUnknown("commit failed"), 503, "outcome_unknown", None),  # before its base class
    (WriteUnavailable("mysql down"), 503, "mysql_unavailable", None),
    (_WriterAway("restarting"), 503, "writer_unavailable", None),  # the code is the kind
    (WriterOverloaded(), 503, "overloaded", None),
    (ClientIdConflict(Message(1, "a", "b", "x", now_ms())), 409, "client_msg_id_conflict", "client_msg_id"),
])
def test_each_failure_has_its_answer(exc, status, code, field):
    got_status, got_code, message, got_field = answer_for(exc)
    assert (got_status, got_code, got_field) == (status, code, field)
    assert message


def test_a_failure_without_an_answer_is_a_bug_not_a_guess():
    from chat.errors import ChatError
    with pytest.raises(LookupError):
        answer_for(ChatError("unknown"))
