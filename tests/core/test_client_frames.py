"""A WebSocket's acks and read markers on their way to the writer (daemon/client_frames.py):
one request at a time, newer frames replace waiting ones, and what waits is bounded."""

import asyncio

import orjson

from chat.messages import Kind
from daemon.client_frames import READS_WAITING_MAX, ClientFrames
from tests.timing import eventually


def frame(**fields) -> bytes:
    return orjson.dumps(fields)


async def test_a_flood_is_coalesced_one_request_at_a_time_and_what_waits_is_bounded():
    sent, release, errors = [], asyncio.Event(), []

    async def submit(draft):
        sent.append((draft.kind, draft.recipient, draft.ref_id))
        await release.wait()
        return None, True

    frames = ClientFrames("bob", "phone", submit, errors.append)
    frames.take(frame(type="ack", upto="1"))
    await eventually(lambda: sent, "the first request out")  # the rest wait behind it
    assert sent == [(Kind.ACK, "phone", 1)]
    for upto in range(2, 1002):  # a thousand acks: one waits, the highest
        frames.take(frame(type="ack", upto=str(upto)))
    for i in range(READS_WAITING_MAX + 36):  # markers for more peers than may wait
        frames.take(frame(type="read", peer=f"p{i}", upto="5"))
        frames.take(frame(type="read", peer=f"p{i}", upto="3"))  # an older marker changes nothing
    release.set()
    await eventually(lambda: len(sent) == 2 + READS_WAITING_MAX, "what waited, sent")
    frames.take(frame(type="ack", upto="2000"))  # a barrier: the next request, and nothing before it
    await eventually(lambda: sent[-1] == (Kind.ACK, "phone", 2000), "the barrier ack out")
    assert len(sent) == 3 + READS_WAITING_MAX
    assert sent[1] == (Kind.ACK, "phone", 1001)
    reads = sent[2:-1]
    assert len(reads) == READS_WAITING_MAX  # the oldest waiting peers gave way to the newest
    assert [peer for _k, peer, _u in reads] == [f"p{i}" for i in range(36, READS_WAITING_MAX + 36)]
    assert {upto for _k, _p, upto in reads} == {5}
    assert errors == []
    frames.close()
