"""The link between an API process and the host's writer process, over
``socket.socketpair()``: ``writer.client.RemoteWriter`` on one end,
``writer.server.Link`` on the other, the frames of writer/protocol.py between
them, and a fake writer behind the link whose answers the test gives. No
database, no process: what only the real writer process shows (its restart,
its death, its socket's mode) is tests/e2e/test_writer_process.py's.
"""

import asyncio
import contextlib
import socket
from datetime import UTC, datetime

import pytest

from chat.drafts import Draft
from chat.messages import Message
from chat.write_errors import ClientIdConflict, Outcome, WriteOutcomeUnknown, WriterOverloaded, WriteUnavailable
from tests.timing import PATIENCE
from writer import protocol
from writer.client import RemoteWriter, WriterUnreachable
from writer.server import Link, Unanswered

FRAME_MAX = protocol.request_frame_max(4000)
AT = datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=UTC)


def stored(msg_id: int, body: str = "hi", client_msg_id: str | None = None) -> Message:
    return Message(msg_id, "alice", "bob", body, AT, client_msg_id)


class FakeWriter:
    """The writer process's writers: each request's future waits for the test to settle it."""

    def __init__(self, overloaded: bool = False):
        self.overloaded = overloaded
        self.requests: asyncio.Queue[tuple[Draft, asyncio.Future]] = asyncio.Queue()

    def enqueue(self, draft: Draft) -> asyncio.Future:
        if self.overloaded:
            raise WriterOverloaded
        future = asyncio.get_running_loop().create_future()
        self.requests.put_nowait((draft, future))
        return future

    async def next_request(self) -> tuple[Draft, asyncio.Future]:
        async with asyncio.timeout(PATIENCE):
            return await self.requests.get()


class Host:
    """The writer process's end: each connection is a fresh socketpair whose
    other end a ``Link`` reads, as ``writer.server.run`` serves an accepted one."""

    def __init__(self, writer: FakeWriter):
        self.writer = writer
        self.unanswered = Unanswered()
        self.streams: list[asyncio.StreamWriter] = []  # the writer's side of each link, in order
        self.reading: list[asyncio.Task] = []  # each link's Link.read_requests

    async def serve(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new link: the writer's end served, the API's end returned."""
        ours, theirs = socket.socketpair()
        reader, stream = await asyncio.open_unix_connection(sock=ours)
        link = Link(self.writer, reader, stream, self.unanswered, FRAME_MAX)
        self.streams.append(stream)
        self.reading.append(asyncio.create_task(link.read_requests()))
        return await asyncio.open_unix_connection(sock=theirs)

    async def link_ended(self, index: int) -> None:
        """Until link ``index`` has read to the end of what the API side sends."""
        async with asyncio.timeout(PATIENCE):
            await self.reading[index]

    async def close(self) -> None:
        for stream in self.streams:
            stream.close()
        await asyncio.gather(*self.reading, return_exceptions=True)


@contextlib.asynccontextmanager
async def linked(writer: FakeWriter | None = None, **options):
    """(RemoteWriter, Host) joined by socketpairs."""
    host = Host(writer or FakeWriter())
    remote = RemoteWriter("unused", connect=host.serve, **{"wait_seconds": PATIENCE, "reply_seconds": PATIENCE,
                                                            **options})
    try:
        yield remote, host
    finally:
        await remote.close()
        await host.close()


async def answer_of(task: asyncio.Task):
    async with asyncio.timeout(PATIENCE):
        return await task


async def test_a_message_goes_over_the_link_and_its_answer_comes_back_exactly():
    async with linked() as (remote, host):
        draft = Draft("alice", "bob", "<b>'; DROP TABLE messages; -- 🙂 שלום\u2028", "c-1")
        posting = asyncio.create_task(remote.submit(draft))
        got, future = await host.writer.next_request()
        assert got == draft
        msg = Message(2**53 + 7, "alice", "bob", draft.body, AT, "c-1")
        future.set_result((msg, True))
        assert await answer_of(posting) == (msg, True)


@pytest.mark.parametrize(("settle", "expected"), [
    (lambda f: f.set_result((stored(5), False)), (stored(5), False)),  # a retry's original
    (lambda f: f.set_exception(ClientIdConflict(stored(5))), ClientIdConflict),
    (lambda f: f.set_exception(WriteOutcomeUnknown("x")), WriteOutcomeUnknown),
    (lambda f: f.set_exception(WriteUnavailable("x")), WriteUnavailable),
    (lambda f: f.set_exception(RuntimeError("a bug of the writer")), WriteOutcomeUnknown),  # may have been stored
])
async def test_each_answer_of_the_writer_reaches_the_post_as_the_writer_gave_it(settle, expected):
    async with linked() as (remote, host):
        posting = asyncio.create_task(remote.submit(Draft("alice", "bob", "hi")))
        _draft, future = await host.writer.next_request()
        settle(future)
        if isinstance(expected, tuple):
            assert await answer_of(posting) == expected
            return
        with pytest.raises(expected) as raised:
            await answer_of(posting)
        assert type(raised.value) is expected  # WriteUnavailable, not its WriterUnreachable: it was sent
        if expected is ClientIdConflict:
            assert raised.value.original == stored(5)


async def test_a_writer_with_a_full_queue_answers_overloaded_at_once():
    async with linked(FakeWriter(overloaded=True)) as (remote, _host):
        with pytest.raises(WriterOverloaded):
            await answer_of(asyncio.create_task(remote.submit(Draft("alice", "bob", "hi"))))


async def test_answers_are_matched_to_their_requests_in_whatever_order_they_come():
    async with linked() as (remote, host):
        posting = [asyncio.create_task(remote.submit(Draft("alice", "bob", f"m{i}"))) for i in range(3)]
        requests = [await host.writer.next_request() for _ in range(3)]
        for draft, future in reversed(requests):
            future.set_result((stored(int(draft.body[1:]) + 10, draft.body), True))
        assert [(await answer_of(p))[0].body for p in posting] == ["m0", "m1", "m2"]
        assert [(await answer_of(p))[0].id for p in posting] == [10, 11, 12]


async def test_a_stopping_writer_answers_what_it_was_sent_and_the_next_request_goes_to_the_next_writer():
    async with linked() as (remote, host):
        before = asyncio.create_task(remote.submit(Draft("alice", "bob", "before the stop")))
        _draft, sent_before = await host.writer.next_request()
        host.streams[0].write(protocol.GOODBYE)
        await host.link_ended(0)  # the API side half-closed: it sends nothing more on that link
        after = asyncio.create_task(remote.submit(Draft("alice", "bob", "after the stop")))
        draft, sent_after = await host.writer.next_request()
        assert draft.body == "after the stop" and len(host.streams) == 2  # on a new link
        sent_after.set_result((stored(2, "after the stop"), True))
        assert (await answer_of(after))[0].id == 2
        assert not before.done()  # the old link is kept until its writer has answered
        sent_before.set_result((stored(1, "before the stop"), True))
        assert (await answer_of(before))[0].id == 1


async def test_a_request_already_on_its_way_when_the_goodbye_is_sent_is_read_and_answered():
    # An API process that had not read the goodbye yet: its request comes after
    # it, then its end of stream. The link reads to that end and answers all.
    host = Host(FakeWriter())
    try:
        reader, stream = await host.serve()
        host.streams[0].write(protocol.GOODBYE)
        stream.write(protocol.request(7, Draft("alice", "bob", "in flight")))
        stream.write_eof()
        draft, future = await host.writer.next_request()
        assert draft.body == "in flight"
        await host.link_ended(0)
        future.set_result((stored(3, "in flight"), True))
        async with asyncio.timeout(PATIENCE):
            assert protocol.parse_reply(await protocol.read_frame(reader, protocol.REPLY_FRAME_MAX)) == \
                (0, None, None)  # the goodbye
            assert protocol.parse_reply(await protocol.read_frame(reader, protocol.REPLY_FRAME_MAX)) == \
                (7, Outcome.CREATED, stored(3, "in flight"))
        stream.close()
    finally:
        await host.close()


async def test_a_lost_link_fails_only_the_requests_sent_on_it_and_as_may_have_been_stored():
    async with linked() as (remote, host):
        on_old = asyncio.create_task(remote.submit(Draft("alice", "bob", "old")))
        await host.writer.next_request()
        host.streams[0].write(protocol.GOODBYE)
        await host.link_ended(0)
        on_new = asyncio.create_task(remote.submit(Draft("alice", "bob", "new")))
        _draft, sent_new = await host.writer.next_request()
        host.streams[0].close()  # the old writer died before answering
        with pytest.raises(WriteOutcomeUnknown):
            await answer_of(on_old)
        assert not on_new.done()
        sent_new.set_result((stored(4, "new"), True))
        assert (await answer_of(on_new))[0].id == 4


async def test_a_request_made_once_the_link_closed_but_before_its_reader_saw_it_goes_to_the_next_writer():
    # A killed writer: the API end's transport is closed (the peer's end went)
    # before the task that reads the link has run. Closing that transport here
    # makes the same state at once, deterministically.
    async with linked() as (remote, host):
        first = asyncio.create_task(remote.submit(Draft("alice", "bob", "first")))
        _draft, future = await host.writer.next_request()
        future.set_result((stored(1, "first"), True))
        await answer_of(first)
        remote._stream.close()  # the link's connection is gone; its reader runs later
        posting = asyncio.create_task(remote.submit(Draft("alice", "bob", "next")))
        got, future = await host.writer.next_request()  # not lost, nor failed as "may have been stored"
        assert got.body == "next" and len(host.streams) == 2  # on a new link
        future.set_result((stored(2, "next"), True))
        assert (await answer_of(posting))[0].id == 2


async def test_a_request_unanswered_past_reply_seconds_may_have_been_stored_and_its_late_answer_is_dropped():
    async with linked(reply_seconds=0.05) as (remote, host):  # the writer never answers in time
        with pytest.raises(WriteOutcomeUnknown):
            await answer_of(asyncio.create_task(remote.submit(Draft("alice", "bob", "late"))))
        _draft, late = await host.writer.next_request()
        late.set_result((stored(1, "late"), True))  # comes after the API gave up on it
        nxt = asyncio.create_task(remote.submit(Draft("alice", "bob", "next")))
        _draft, future = await host.writer.next_request()
        future.set_result((stored(2, "next"), True))
        assert (await answer_of(nxt))[0].id == 2  # the late answer went to nobody, the link goes on
        assert len(host.streams) == 1


async def test_a_writer_away_past_the_wait_is_unreachable_and_a_later_post_finds_it_back():
    host = Host(FakeWriter())
    away = True

    async def connect():
        if away:
            raise ConnectionRefusedError  # the socket of a writer that is restarting
        return await host.serve()

    remote = RemoteWriter("unused", wait_seconds=0.05, reply_seconds=PATIENCE, connect=connect)
    try:
        with pytest.raises(WriterUnreachable) as raised:
            await answer_of(asyncio.create_task(remote.submit(Draft("alice", "bob", "while away"))))
        assert isinstance(raised.value, WriteUnavailable) and raised.value.kind == "writer_unavailable"
        assert not await remote.ready(0.05)
        assert host.writer.requests.empty()  # nothing was sent: nothing stored
        away = False
        assert await remote.ready(PATIENCE)  # the attempts went on after the POST gave up: connected
        posting = asyncio.create_task(remote.submit(Draft("alice", "bob", "back")))
        _draft, future = await host.writer.next_request()
        future.set_result((stored(1, "back"), True))
        assert (await answer_of(posting))[0].id == 1
    finally:
        await remote.close()
        await host.close()


async def test_a_reply_of_the_wrong_shape_drops_the_link_and_the_next_request_takes_a_new_one():
    async with linked() as (remote, host):
        posting = asyncio.create_task(remote.submit(Draft("alice", "bob", "hi")))
        await host.writer.next_request()
        host.streams[0].write(protocol.frame([1, "no such outcome", None]))
        with pytest.raises(WriteOutcomeUnknown):
            await answer_of(posting)
        again = asyncio.create_task(remote.submit(Draft("alice", "bob", "again")))
        _draft, future = await host.writer.next_request()
        future.set_result((stored(2, "again"), True))
        assert (await answer_of(again))[0].id == 2 and len(host.streams) == 2


@pytest.mark.parametrize("data", [
    protocol.frame([1, "alice", {"$ne": ""}, "body", None]),  # an operator where a string belongs
    protocol.HEADER.pack(3) + b"[1,",  # not JSON
    protocol.HEADER.pack(FRAME_MAX + 1) + b"[",  # over the frame limit
])
async def test_a_bad_frame_ends_only_its_link_and_nothing_of_it_is_stored(data):
    host = Host(FakeWriter())
    try:
        reader, stream = await host.serve()
        _good_reader, good = await host.serve()
        stream.write(data)
        await host.link_ended(0)
        async with asyncio.timeout(PATIENCE):
            assert await reader.read() == b""  # closed by the writer, no reply
        assert host.writer.requests.empty()
        good.write(protocol.request(1, Draft("alice", "bob", "still served")))
        draft, _future = await host.writer.next_request()
        assert draft.body == "still served" and not host.reading[1].done()
        stream.close()
        good.close()
    finally:
        await host.close()


async def test_a_stopping_writer_waits_for_every_request_it_read_to_be_answered():
    # What writer.server.run waits for (bounded by its timeouts) before it closes the links.
    host = Host(FakeWriter())
    try:
        reader, stream = await host.serve()
        for seq in (1, 2):
            stream.write(protocol.request(seq, Draft("alice", "bob", f"m{seq}")))
        first, second = [(await host.writer.next_request())[1] for _ in range(2)]
        settled = asyncio.create_task(host.unanswered.settled())
        first.set_result((stored(1), True))
        async with asyncio.timeout(PATIENCE):
            assert (await protocol.read_frame(reader, protocol.REPLY_FRAME_MAX))[0] == 1  # answered
        assert host.unanswered.count == 1 and not settled.done()
        second.set_exception(WriteUnavailable("x"))
        async with asyncio.timeout(PATIENCE):
            await settled
        stream.close()
    finally:
        await host.close()
