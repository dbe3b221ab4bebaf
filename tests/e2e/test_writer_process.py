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

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chatctl.client import Inbox, listen
from tests.e2e.helpers import mongo_docs_soon, mysql_rows, post
from tests.system import private_system

WAIT_SECONDS = 3


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    with private_system(tmp_path_factory.mktemp("writer"), daemons=1, apis=2, writer=True,
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
        await asyncio.sleep(0.2)
    raise AssertionError(f"{client_msg_id} never stored: {statuses}")


async def traffic(system, sender, to, count, every, during):
    """``count`` POSTs, each on a new connection (either API process may take
    it), ``every`` seconds apart, while ``during()`` runs; returns ids and statuses."""
    fault = asyncio.create_task(during())
    async with httpx.AsyncClient(timeout=20, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        tasks = []
        for i in range(count):
            tasks.append(asyncio.create_task(post_until_stored(system, sender, to, f"m{i}", f"c{i}", client)))
            await asyncio.sleep(every)
        results = await asyncio.gather(*tasks)
    await fault
    return [r[0] for r in results], [r[1] for r in results]


async def listening(system, user) -> tuple[Inbox, asyncio.Task]:
    """A reconnecting WebSocket client of ``user``, connected before the traffic starts."""
    inbox = Inbox()
    task = asyncio.create_task(listen(system.ws_url, system.token(user), None, lambda f: None,
                                      max_backoff=0.5, inbox=inbox))
    async with asyncio.timeout(10):
        while not inbox.hellos:
            await asyncio.sleep(0.05)
    return inbox, task


async def delivered(inbox: Inbox, task: asyncio.Task, ids, timeout=30) -> Inbox:
    try:
        async with asyncio.timeout(timeout):
            while not set(ids) <= inbox.seen:
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # and nothing more comes
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return inbox


def assert_stored_once(system, sender, ids):
    rows = mysql_rows(system, "sender = :s", s=sender)
    assert sorted(r.id for r in rows) == sorted(ids)
    assert len({r.client_msg_id for r in rows}) == len(rows)


async def test_both_api_processes_write_through_the_one_writer(hosted, users):
    sender, to = users("s"), users("r")
    listener = await listening(hosted, to)
    ids, statuses = await traffic(hosted, sender, to, 100, 0.005, lambda: asyncio.sleep(0))
    assert all(s == [201] for s in statuses)
    assert len(set(ids)) == 100
    assert_stored_once(hosted, sender, ids)
    docs = await mongo_docs_soon(hosted, {"from": sender}, 100)
    assert sorted(d["_id"] for d in docs) == sorted(ids)
    inbox = await delivered(*listener, ids)
    assert inbox.duplicates == 0 and inbox.ids == sorted(ids)


def _mongo_lag_count(system) -> float:
    text = httpx.get(f"http://127.0.0.1:{system.writer_metrics_port}/metrics", timeout=5).text
    return next(s.value for f in text_string_to_metric_families(text) if f.name == "chat_writer_mongo_lag_seconds"
                for s in f.samples if s.name.endswith("_count"))


async def test_the_writer_s_metrics_port_counts_each_message_s_wait_for_mongo(hosted, users):
    # Ops and the benchmarks read what the writer adds to a delivery here:
    # one observation per message stored, once its Mongo insert returned.
    before = _mongo_lag_count(hosted)
    sender, to = users("s"), users("r")
    ids, _ = await traffic(hosted, sender, to, 20, 0.005, lambda: asyncio.sleep(0))
    await mongo_docs_soon(hosted, {"from": sender}, 20)
    async with asyncio.timeout(5):
        while _mongo_lag_count(hosted) < before + len(ids):
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert _mongo_lag_count(hosted) == before + len(ids)


def _families(url: str) -> dict[str, dict[str, float]]:
    """Each metric family on ``url``'s /metrics: sample name -> value (labels dropped, summed)."""
    families: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        samples = families.setdefault(family.name, {})
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return families


async def test_each_process_exports_what_it_does_under_its_own_name(hosted, users):
    # The writer process counts the group commits; the API processes that
    # hand it their messages count requests, and no batch of their own.
    sender, to = users("s"), users("r")
    ids, _ = await traffic(hosted, sender, to, 10, 0.005, lambda: asyncio.sleep(0))
    await mongo_docs_soon(hosted, {"from": sender}, 10)
    writer = _families(f"http://127.0.0.1:{hosted.writer_metrics_port}")
    assert writer["chat_writer_batch_messages"]["chat_writer_batch_messages_sum"] >= len(ids)
    assert writer["chat_writer_batch_seconds"]["chat_writer_batch_seconds_count"] >= 1
    assert {"chat_writer_gc_pause_seconds", "chat_writer_outbox_messages", "chat_writer_outbox_age_seconds",
            "chat_writer_mongo_lag_seconds"} <= set(writer)
    assert not [name for name in writer if name.startswith("chat_api_")]
    api = _families(hosted.api_url)  # the shared port: one API process or the other, each the same shape
    assert "chat_api_requests" in api and "chat_api_gc_pause_seconds" in api
    assert not [name for name in api if name.startswith("chat_writer_")]


async def test_a_writer_restart_delays_posts_and_refuses_none(hosted, users):
    sender, to = users("s"), users("r")
    listener = await listening(hosted, to)

    async def restart():
        await asyncio.sleep(0.5)
        # in a thread: the event loop goes on posting meanwhile
        await asyncio.to_thread(hosted.stop, "writer", signal.SIGTERM)
        await asyncio.to_thread(hosted.start, "writer")

    started = time.monotonic()
    ids, statuses = await traffic(hosted, sender, to, 120, 0.02, restart)
    assert time.monotonic() - started < 20
    assert all(s == [201] for s in statuses), [s for s in statuses if s != [201]]
    assert_stored_once(hosted, sender, ids)
    inbox = await delivered(*listener, ids)
    assert inbox.duplicates == 0 and sorted(inbox.ids) == sorted(ids)


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
            sock.settimeout(10)
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
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
        hosted.start("writer")
    assert sorted(r.body for r in mysql_rows(hosted, "sender = :s", s=sender)) == ["before the stop", "in flight"]


def test_a_link_that_never_ends_its_side_holds_a_stopping_writer_only_so_long(hosted):
    """The goodbye's bound: a connection that reads the goodbye and never
    half-closes is read for CHAT_DB_TIMEOUT_SECONDS (2) at most; then the
    writer closes it and exits, and its successor serves."""
    proc = hosted.procs.pop("writer")
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(20)
            sock.connect(socket_path(hosted))
            proc.send_signal(signal.SIGTERM)
            assert read_reply(sock) == [0, "stopping", None]
            started = time.monotonic()
            assert read_reply(sock) is None  # closed by the writer, with this side still open
            assert 1.5 < time.monotonic() - started < 10
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
        hosted.start("writer")


async def test_a_killed_writer_loses_nothing_and_retries_store_once(hosted, users):
    sender, to = users("s"), users("r")
    listener = await listening(hosted, to)

    async def kill():
        await asyncio.sleep(0.5)
        await asyncio.to_thread(hosted.stop, "writer", signal.SIGKILL)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(hosted.start, "writer")

    ids, statuses = await traffic(hosted, sender, to, 120, 0.01, kill)
    assert len(set(ids)) == 120
    assert_stored_once(hosted, sender, ids)
    docs = await mongo_docs_soon(hosted, {"from": sender}, 120, timeout=15)
    assert sorted(d["_id"] for d in docs) == sorted(ids)  # the outbox was copied: every message reached Mongo once
    inbox = await delivered(*listener, ids)
    assert inbox.duplicates == 0 and sorted(inbox.ids) == sorted(ids)


async def test_a_writer_away_past_the_wait_is_a_503_and_stores_nothing(hosted, users):
    sender, to = users("s"), users("r")
    hosted.stop("writer", signal.SIGTERM)
    try:
        started = time.monotonic()
        r = await post(hosted, sender, to, "hello", "c1")
        waited = time.monotonic() - started
        assert r.status_code == 503
        assert r.json()["error"] == "writer_unavailable"
        assert r.headers["retry-after"] == "1"
        assert WAIT_SECONDS - 0.5 < waited < WAIT_SECONDS + 3
        async with httpx.AsyncClient() as client:
            ready = await client.get(f"{hosted.api_url}/readyz", timeout=10)
        assert ready.status_code == 503 and ready.json()["checks"]["writer"].startswith("down")
    finally:
        hosted.start("writer")
    assert mysql_rows(hosted, "sender = :s", s=sender) == []
    r = await post(hosted, sender, to, "hello", "c1")
    assert r.status_code == 201
    assert len(mysql_rows(hosted, "sender = :s", s=sender)) == 1


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
        sock.settimeout(10)
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
