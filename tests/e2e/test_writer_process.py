"""The host's writer process (writer/), as deployed: two API processes hand
every message to it over a Unix socket. Its restarts delay POSTs and refuse
none; its death loses nothing and, with client_msg_id retries, stores nothing
twice; hostile bytes on its socket store nothing and stop nothing else."""

import asyncio
import os
import signal
import socket
import stat
import struct
import time
import uuid

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chat.settings import Settings
from chatctl.client import Inbox, listen
from tests.e2e.helpers import mongo_docs_soon, mysql_rows, post
from harness.system import private_system
from tests.timing import PATIENCE, eventually

DB_TIMEOUT_SECONDS = Settings.field("stores.db_timeout_seconds").default  # the module's systems keep it
WAIT_SECONDS = 1  # CHAT_WRITER_WAIT_SECONDS of the system whose writer stays away past it


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    # "A restart refuses no POST" holds for a restart that is over within
    # CHAT_WRITER_WAIT_SECONDS: here that is how long the tests give a writer
    # process to start again, a time limit like any other (a multiple of S),
    # so that a loaded machine's slow process start is not taken for a refusal.
    with private_system(tmp_path_factory.mktemp("writer"), daemons=1, apis=2, writer=True,
                        CHAT_RATE_LIMIT_PER_SECOND=0, CHAT_WRITER_WAIT_SECONDS=PATIENCE) as system:
        yield system


@pytest.fixture
def briefly_waiting(tmp_path_factory):
    """The write path alone, whose API processes wait WAIT_SECONDS for their writer."""
    with private_system(tmp_path_factory.mktemp("writer-away"), daemons=0, apis=1, writer=True,
                        CHAT_RATE_LIMIT_PER_SECOND=0, CHAT_WRITER_WAIT_SECONDS=WAIT_SECONDS) as system:
        yield system


def socket_path(system) -> str:
    return system.env["CHAT_WRITER_SOCKET"]


async def post_until_stored(system, sender, to, body, client_msg_id, client, attempts=40) -> tuple[int, list[int]]:
    """(message id, statuses seen): retries as a client does, same client_msg_id."""
    statuses = []
    for _ in range(attempts):
        try:
            r = await post(system, sender, to, body, client_msg_id, client=client)
            statuses.append(r.status_code)
            if r.status_code in (200, 201):
                return int(r.json()["id"]), statuses
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
        except httpx.HTTPError:
            statuses.append(0)
        await asyncio.sleep(0.2)  # pacing: a client's retries
    raise AssertionError(f"{client_msg_id} never stored: {statuses}")


async def traffic(system, sender, to, count, every, during=None):
    """``count`` POSTs, each on a new connection (either API process may take
    it), ``every`` seconds apart, while ``during(sent)`` runs (``sent``: how
    many POSTs have gone so far); returns ids and statuses."""
    sent: list[asyncio.Task] = []
    fault = asyncio.create_task(during(sent)) if during else None
    async with httpx.AsyncClient(timeout=PATIENCE, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        for i in range(count):
            sent.append(asyncio.create_task(post_until_stored(system, sender, to, f"m{i}", f"c{i}", client)))
            await asyncio.sleep(every)  # pacing: the POSTs' rate
        results = await asyncio.gather(*sent)
    if fault is not None:
        await fault
    return [r[0] for r in results], [r[1] for r in results]


async def stored(system, sender, count: int) -> None:
    """Until ``count`` of ``sender``'s messages are in MySQL: the traffic is flowing."""
    def enough() -> bool:
        return len(mysql_rows(system, "sender = :s", s=sender)) >= count

    await eventually(lambda: asyncio.to_thread(enough), f"{count} messages of {sender} stored")


async def listening(system, user) -> tuple[Inbox, asyncio.Task]:
    """A reconnecting WebSocket client of ``user``, connected before the traffic starts."""
    inbox = Inbox()
    task = asyncio.create_task(listen(system.ws_url, system.token(user), None, lambda f: None,
                                      max_backoff=0.5, inbox=inbox))
    await eventually(lambda: inbox.hellos, f"{user}'s client connected")
    return inbox, task


async def delivered(system, to: str, listener: tuple[Inbox, asyncio.Task], ids) -> tuple[Inbox, int]:
    """``to``'s inbox once every id in ``ids`` has come, and then a marker
    posted to ``to`` after them: one user's frames come in order, so a
    duplicate that was on its way comes before it. Returns (inbox, the marker's id)."""
    inbox, task = listener
    try:
        await eventually(lambda: set(ids) <= inbox.seen, f"{len(ids)} messages delivered to {to}")
        r = await post(system, f"marker-{uuid.uuid4().hex[:8]}", to, "marker")
        assert r.status_code == 201, r.text
        marker = int(r.json()["id"])
        await eventually(lambda: marker in inbox.seen, "the marker delivered after them")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return inbox, marker


def assert_stored_once(system, sender, ids):
    rows = mysql_rows(system, "sender = :s", s=sender)
    assert sorted(r.id for r in rows) == sorted(ids)
    assert len({r.client_msg_id for r in rows}) == len(rows)


async def test_both_api_processes_write_through_the_one_writer(hosted, users):
    sender, to = users("s"), users("r")
    listener = await listening(hosted, to)
    ids, statuses = await traffic(hosted, sender, to, 100, 0.005)
    assert all(s == [201] for s in statuses)
    assert len(set(ids)) == 100
    assert_stored_once(hosted, sender, ids)
    docs = await mongo_docs_soon(hosted, {"from": sender}, 100)
    assert sorted(d["_id"] for d in docs) == sorted(ids)
    inbox, marker = await delivered(hosted, to, listener, ids)
    assert inbox.duplicates == 0 and inbox.ids == [*sorted(ids), marker]


def _mongo_lag_count(system) -> float:
    text = httpx.get(f"http://127.0.0.1:{system.writer_metrics_port}/metrics", timeout=PATIENCE).text
    return next(s.value for f in text_string_to_metric_families(text) if f.name == "chat_writer_mongo_lag_seconds"
                for s in f.samples if s.name.endswith("_count"))


async def test_the_writer_s_metrics_port_counts_each_message_s_wait_for_mongo(hosted, users):
    # Ops and the benchmarks read what the writer adds to a delivery here:
    # one observation per message stored, once its Mongo insert returned.
    before = _mongo_lag_count(hosted)
    sender, to = users("s"), users("r")
    ids, _ = await traffic(hosted, sender, to, 20, 0.005)
    # One more message, after them: its insert follows theirs, and so does its
    # observation, so a second count of any of theirs would come before it.
    assert (await post(hosted, sender, to, "last")).status_code == 201
    await mongo_docs_soon(hosted, {"from": sender}, len(ids) + 1)
    await eventually(lambda: _mongo_lag_count(hosted) >= before + len(ids) + 1, "the last message's wait observed")
    assert _mongo_lag_count(hosted) == before + len(ids) + 1


def _families(url: str) -> dict[str, dict[str, float]]:
    """Each metric family on ``url``'s /metrics: sample name -> value (labels dropped, summed)."""
    families: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=PATIENCE).text):
        samples = families.setdefault(family.name, {})
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return families


async def test_each_process_exports_what_it_does_under_its_own_name(hosted, users):
    # The writer process counts the group commits; the API processes that
    # hand it their messages count requests, and no batch of their own.
    sender, to = users("s"), users("r")
    ids, _ = await traffic(hosted, sender, to, 10, 0.005)
    await mongo_docs_soon(hosted, {"from": sender}, 10)
    writer = _families(f"http://127.0.0.1:{hosted.writer_metrics_port}")
    assert writer["chat_writer_batch_messages"]["chat_writer_batch_messages_sum"] >= len(ids)
    assert writer["chat_writer_batch_seconds"]["chat_writer_batch_seconds_count"] >= 1
    # each turn's wait for its partition's lock and its hold of it, observed together once it ends
    text = httpx.get(f"http://127.0.0.1:{hosted.writer_metrics_port}/metrics", timeout=PATIENCE).text
    turns = {s.labels["phase"]: s.value for f in text_string_to_metric_families(text)
             if f.name == "chat_writer_turn_seconds" for s in f.samples if s.name.endswith("_count")}
    assert turns.keys() == {"waiting", "holding"} and turns["waiting"] == turns["holding"] >= 1
    assert {"chat_writer_gc_pause_seconds", "chat_writer_outbox_messages", "chat_writer_outbox_age_seconds",
            "chat_writer_mongo_lag_seconds"} <= set(writer)
    assert not [name for name in writer if name.startswith("chat_api_")]
    api = _families(hosted.api_url)  # the shared port: one API process or the other, each the same shape
    assert "chat_api_requests" in api and "chat_api_gc_pause_seconds" in api
    assert not [name for name in api if name.startswith("chat_writer_")]


async def test_a_writer_restart_delays_posts_and_refuses_none(hosted, users):
    sender, to = users("s"), users("r")
    listener = await listening(hosted, to)

    async def restart(sent):
        await stored(hosted, sender, 10)
        # in a thread: the event loop goes on posting meanwhile
        await asyncio.to_thread(hosted.stop, "writer", signal.SIGTERM)
        await asyncio.to_thread(hosted.start, "writer")

    ids, statuses = await traffic(hosted, sender, to, 120, 0.02, restart)
    assert all(s == [201] for s in statuses), [s for s in statuses if s != [201]]
    assert_stored_once(hosted, sender, ids)
    inbox, marker = await delivered(hosted, to, listener, ids)
    assert inbox.duplicates == 0 and sorted(inbox.ids) == [*sorted(ids), marker]


def read_reply(sock: socket.socket) -> list | None:
    """The next frame on a raw writer connection, or None at its end."""
    head = sock.recv(4, socket.MSG_WAITALL)
    if not head:
        return None
    (size,) = struct.unpack("!I", head)
    return orjson.loads(sock.recv(size, socket.MSG_WAITALL))


def test_a_request_sent_as_the_writer_stops_is_answered_not_dropped(hosted, users):
    """The race of a restart: a request already in the socket when the writer
    stops reading would get no answer, so its POST would get 503
    outcome_unknown. The writer says goodbye and reads its link to the end."""
    sender, to = users("s"), users("r")
    proc = hosted.procs.pop("writer")
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(PATIENCE)
            sock.connect(socket_path(hosted))
            sock.sendall(frame([1, sender, to, "before the stop", None]))
            assert read_reply(sock)[:2] == [1, "created"]
            proc.send_signal(signal.SIGTERM)
            assert read_reply(sock) == [0, "stopping", None]
            # sent after the goodbye was written: an API process that had not read it yet
            sock.sendall(frame([2, sender, to, "in flight", None]))
            sock.shutdown(socket.SHUT_WR)
            seq, outcome, message = read_reply(sock)
            assert (seq, outcome, message[3]) == (2, "created", "in flight")
            assert read_reply(sock) is None  # and then the writer closes
        assert proc.wait(timeout=PATIENCE) == 0
    finally:
        proc.kill()
        proc.wait()
        hosted.start("writer")
    assert sorted(r.body for r in mysql_rows(hosted, "sender = :s", s=sender)) == ["before the stop", "in flight"]


def test_a_link_that_never_ends_its_side_holds_a_stopping_writer_only_so_long(hosted):
    """The goodbye's bound: a connection that reads the goodbye and never
    half-closes is read for CHAT_DB_TIMEOUT_SECONDS at most; then the
    writer closes it and exits, and its successor serves."""
    proc = hosted.procs.pop("writer")
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(PATIENCE)  # a writer that waited for this link for ever would leave it open
            sock.connect(socket_path(hosted))
            proc.send_signal(signal.SIGTERM)
            assert read_reply(sock) == [0, "stopping", None]
            started = time.monotonic()
            assert read_reply(sock) is None  # closed by the writer, with this side still open
            # not at once: the writer gave the link its time to end its side
            assert time.monotonic() - started > 0.75 * DB_TIMEOUT_SECONDS
        assert proc.wait(timeout=PATIENCE) == 0
    finally:
        proc.kill()
        proc.wait()
        hosted.start("writer")


async def test_a_killed_writer_loses_nothing_and_retries_store_once(hosted, users):
    sender, to = users("s"), users("r")
    listener = await listening(hosted, to)

    async def kill(sent):
        await stored(hosted, sender, 10)
        await asyncio.to_thread(hosted.stop, "writer", signal.SIGKILL)
        # down while ten more POSTs go out: they wait for the next writer, or are retried
        down_at = len(sent)
        await eventually(lambda: len(sent) >= down_at + 10, "ten POSTs sent while the writer is down")
        await asyncio.to_thread(hosted.start, "writer")

    ids, statuses = await traffic(hosted, sender, to, 120, 0.01, kill)
    assert len(set(ids)) == 120
    assert_stored_once(hosted, sender, ids)
    docs = await mongo_docs_soon(hosted, {"from": sender}, 120)
    assert sorted(d["_id"] for d in docs) == sorted(ids)  # the outbox was copied: every message reached Mongo once
    inbox, marker = await delivered(hosted, to, listener, ids)
    assert inbox.duplicates == 0 and sorted(inbox.ids) == [*sorted(ids), marker]


async def test_a_writer_away_past_the_wait_is_a_503_and_stores_nothing(briefly_waiting, users):
    sender, to = users("s"), users("r")
    briefly_waiting.stop("writer", signal.SIGTERM)
    try:
        started = time.monotonic()
        r = await post(briefly_waiting, sender, to, "hello", "c1")
        waited = time.monotonic() - started
        assert r.status_code == 503
        assert r.json()["error"] == "writer_unavailable"
        assert r.headers["retry-after"] == "1"
        assert waited > 0.9 * WAIT_SECONDS  # it waited for the writer to come back before giving up
        async with httpx.AsyncClient() as client:
            ready = await client.get(f"{briefly_waiting.api_url}/readyz", timeout=PATIENCE)
        assert ready.status_code == 503 and ready.json()["checks"]["writer"].startswith("down")
    finally:
        briefly_waiting.start("writer")
    assert mysql_rows(briefly_waiting, "sender = :s", s=sender) == []
    r = await post(briefly_waiting, sender, to, "hello", "c1")
    assert r.status_code == 201
    assert len(mysql_rows(briefly_waiting, "sender = :s", s=sender)) == 1


def frame(payload) -> bytes:
    data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return struct.pack("!I", len(data)) + data


HOSTILE = {
    "not JSON": frame(b"\xff{not json"),
    "not an array": frame({"to": "x"}),
    "too few fields": frame([1, "a", "b"]),
    "operator where a string belongs": frame([1, "{sender}", {"$ne": ""}, "body", None]),
    "number for a body": frame([1, "{sender}", "b", 5, None]),
    "negative sequence": frame([-1, "{sender}", "b", "body", None]),
    "empty body": frame([1, "{sender}", "b", "", None]),
    "over the frame limit": struct.pack("!I", 10**9) + b"[",
    "truncated": frame([1, "{sender}", "b", "body", None])[:-3],
}


@pytest.mark.parametrize("case", HOSTILE)
async def test_hostile_bytes_on_the_writer_socket_store_nothing_and_close_only_that_connection(hosted, users, case):
    sender = users("hostile")
    data = HOSTILE[case].replace(b"{sender}", sender.encode())
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(PATIENCE)
        sock.connect(socket_path(hosted))
        sock.sendall(data)
        if case == "truncated":
            sock.shutdown(socket.SHUT_WR)  # the frame's end never comes
        try:
            answer = sock.recv(1024)
        except ConnectionResetError:  # closed with bytes it did not read (the frame over the limit)
            answer = b""
        assert answer == b""  # closed by the writer, no reply
    r = await post(hosted, users("s"), users("r"), "still serving")
    assert r.status_code == 201
    assert mysql_rows(hosted, "sender = :s", s=sender) == []


def test_the_writer_socket_is_for_its_owner_only(hosted):
    mode = os.stat(socket_path(hosted)).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
