"""The frames between the API processes and the writer process (writer/protocol.py)."""

import asyncio
import struct
from datetime import UTC, datetime

import orjson
import pytest

from chat.drafts import Draft
from chat.messages import Message
from chat.write_errors import ClientIdConflict, Outcome, WriteOutcomeUnknown, WriteUnavailable
from writer import protocol
from writer.protocol import BadFrame
from writer.server import outcome_of

MSG = Message(2**53 + 7, "alice", "bob", "<b>'; DROP TABLE messages; -- 🙂 שלום\u2028",
              datetime(2026, 11, 23, 23, 59, 59, 999000, tzinfo=UTC), "c-1")


LIMIT = protocol.request_frame_max(4000)


async def frames_of(data: bytes, limit: int = LIMIT) -> list:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    out = []
    while (payload := await protocol.read_frame(reader, limit)) is not None:
        out.append(payload)
    return out


async def test_the_longest_body_of_control_characters_fits_a_request_frame():
    draft = Draft("u" * 64, "v" * 64, "\x01" * 4000, "c" * 64)
    [payload] = await frames_of(protocol.request(2**62, draft))
    assert protocol.parse_request(payload) == (2**62, draft)


async def test_a_request_and_its_reply_come_back_exactly():
    draft = Draft("alice", "bob", MSG.body, None)
    [payload] = await frames_of(protocol.request(41, draft))
    assert protocol.parse_request(payload) == (41, draft)
    [payload] = await frames_of(protocol.reply(41, Outcome.CREATED, MSG))
    assert protocol.parse_reply(payload) == (41, Outcome.CREATED, MSG)  # id past 2**53, the millisecond, the text
    [payload] = await frames_of(protocol.reply(42, Outcome.UNAVAILABLE, None))
    assert protocol.parse_reply(payload) == (42, Outcome.UNAVAILABLE, None)


def framed(obj) -> bytes:
    data = orjson.dumps(obj)
    return struct.pack("!I", len(data)) + data


@pytest.mark.parametrize("data", [
    struct.pack("!I", LIMIT + 1) + b"[",  # over the limit: not read
    framed([1, "a", "b", "c", None])[:-1],  # truncated
    b"\x00\x00",  # a truncated header
    struct.pack("!I", 3) + b"[1,",  # not JSON
    framed({"seq": 1}),  # not an array
])
async def test_a_bad_frame_is_refused(data):
    with pytest.raises(BadFrame):
        await frames_of(data)


@pytest.mark.parametrize("payload", [
    [1, "a", "b", "c"],
    [1, "a", "b", "c", None, "extra"],
    [1, "a", {"$ne": ""}, "c", None],
    [1, "a", "b", 5, None],
    [1, "a", "b", "c", 7],
    [-1, "a", "b", "c", None],
    [True, "a", "b", "c", None],
    [1.5, "a", "b", "c", None],
    [1, "", "b", "c", None],
    [1, "a", "b", "", None],
])
def test_a_request_of_the_wrong_shape_is_refused(payload):
    with pytest.raises(BadFrame):
        protocol.parse_request(payload)


def settled(result=None, exc=None) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)
    return future


@pytest.mark.parametrize(("future", "outcome"), [
    (lambda: settled((MSG, True)), (Outcome.CREATED, MSG)),
    (lambda: settled((MSG, False)), (Outcome.REPLAYED, MSG)),
    (lambda: settled(exc=ClientIdConflict(MSG)), (Outcome.CONFLICT, MSG)),
    (lambda: settled(exc=WriteOutcomeUnknown("x")), (Outcome.OUTCOME_UNKNOWN, None)),
    (lambda: settled(exc=WriteUnavailable("x")), (Outcome.UNAVAILABLE, None)),
    (lambda: settled(exc=RuntimeError("a bug")), (Outcome.OUTCOME_UNKNOWN, None)),  # may have been stored
])
async def test_each_writer_answer_has_its_outcome(future, outcome):
    assert outcome_of(future()) == outcome
