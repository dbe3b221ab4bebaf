"""Operations endpoints, the OpenAPI document, and the per-sender rate limit."""

import asyncio
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine

from api.app import ROUTES
from api.openapi import OPENAPI
from chat import auth
from chat.settings import AuthSettings, Settings, StoresSettings
from tests.e2e.helpers import api_in_process, mysql_rows, post
from harness.system import running_system
from tests.timing import PATIENCE, S, eventually


def test_healthz_and_readyz(system):
    assert httpx.get(f"{system.api_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{system.api_url}/readyz")
    # The shared system writes through a writer process, as deployed: the API asks it too.
    assert ready.status_code == 200 and ready.json()["checks"] == {"mysql": "ok", "mongo": "ok", "writer": "ok"}


def _sample(text: str, line_start: str) -> float:
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)), 0.0)


async def test_metrics_count_requests_batches_and_errors(system, users):
    created = 'chat_api_requests_total{route="/v1/messages",status="201"}'
    before = _sample(httpx.get(f"{system.api_url}/metrics").text, created)
    await post(system, users("a"), users("b"), "x")
    httpx.post(f"{system.api_url}/v1/messages", content=b"{", headers={"Authorization": "Bearer x"})
    text = httpx.get(f"{system.api_url}/metrics").text
    assert _sample(text, created) == before + 1  # counted once (one API process serves the shared system)
    assert "chat_api_request_seconds_bucket" in text
    assert 'chat_api_errors_total{kind="unauthorized"}' in text
    # The group commits are the writer process's, on its own metrics port.
    assert "chat_writer_batch_messages_count" in httpx.get(f"http://127.0.0.1:{system.writer_metrics_port}/metrics").text


def test_unknown_route_and_method_are_json_errors(system):
    r = httpx.get(f"{system.api_url}/nope")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = httpx.delete(f"{system.api_url}/v1/messages")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"


def test_openapi_document_matches_the_routes(system):
    served = httpx.get(f"{system.api_url}/openapi.json").json()
    assert served == OPENAPI
    documented = {(path, method.upper()) for path, ops in OPENAPI["paths"].items() for method in ops}
    routed = {(r.path, m) for r in ROUTES for m in r.methods if m != "HEAD"}
    assert documented == routed
    # the answers the tests observe for POST /v1/messages are the documented ones
    assert set(OPENAPI["paths"]["/v1/messages"]["post"]["responses"]) == {
        "200", "201", "400", "401", "408", "409", "413", "422", "429", "431", "503"}


async def test_rate_limit_429_with_retry_after_and_other_senders_unaffected(dbs, users):
    with running_system(dbs, daemons=0, apis=1, CHAT_RATE_LIMIT_PER_SECOND=0.1, CHAT_RATE_LIMIT_BURST=3) as s:
        spammer, polite, bob = users("spammer"), users("polite"), users("bob")
        codes = [(await post(s, spammer, bob, f"m{i}")).status_code for i in range(5)]
        assert codes[:3] == [201] * 3 and codes[3:] == [429, 429]
        limited = await post(s, spammer, bob, "again")
        assert limited.json()["error"] == "rate_limited" and int(limited.headers["retry-after"]) >= 1
        assert (await post(s, polite, bob, "hi")).status_code == 201
        assert len(mysql_rows(s, "sender = :s", s=spammer)) == 3


async def test_writer_queue_full_is_503_overloaded_and_nothing_is_half_stored(dbs, users):
    with running_system(dbs, daemons=0, apis=1, CHAT_RATE_LIMIT_PER_SECOND=0, CHAT_WRITER_QUEUE_MAX=1) as s:
        alice, bob = users("alice"), users("bob")
        async with httpx.AsyncClient(timeout=PATIENCE) as c:
            replies = await asyncio.gather(*(post(s, alice, bob, f"m{i}", f"q{i}", client=c) for i in range(60)))
        codes = [r.status_code for r in replies]
        assert 503 in codes and 201 in codes
        assert all(r.json()["error"] == "overloaded" and r.headers["retry-after"] == "1"
                   for r in replies if r.status_code == 503)
        stored = {row.client_msg_id for row in mysql_rows(s, "sender = :s", s=alice)}
        assert stored == {f"q{i}" for i, r in enumerate(replies) if r.status_code == 201}


async def test_group_commit_never_exceeds_batch_max_and_answers_every_request(dbs, users):
    with running_system(dbs, daemons=0, apis=1, CHAT_RATE_LIMIT_PER_SECOND=0, CHAT_BATCH_MAX=3) as s:
        alice, bob = users("alice"), users("bob")
        async with httpx.AsyncClient(timeout=PATIENCE) as c:
            replies = await asyncio.gather(*(post(s, alice, bob, f"b{i}", client=c) for i in range(40)))
        assert all(r.status_code == 201 for r in replies)
        assert len(mysql_rows(s, "sender = :s", s=alice)) == 40

        def sample(text, name):
            return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))

        # 40 concurrent requests would share one or two batches; capped at 3, they need 14.
        # A batch is observed once its Mongo copy is done, which follows its 201.
        async with httpx.AsyncClient(timeout=10 * S) as c:
            async def fourteen_batches() -> str | None:
                text = (await c.get(f"{s.api_url}/metrics")).text
                return text if sample(text, "chat_writer_batch_messages_count") >= 14 else None

            text = await eventually(fourteen_batches, "14 group commits observed")
        total = sample(text, "chat_writer_batch_messages_count")
        assert sample(text, 'chat_writer_batch_messages_bucket{le="5.0"}') == total


def _http10(sock, system, sender, to, keep_alive: bool) -> bytes:
    body = f'{{"to": "{to}", "body": "over HTTP/1.0"}}'.encode()
    head = (f"POST /v1/messages HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {system.token(sender)}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + ("Connection: keep-alive\r\n" if keep_alive else "") + "\r\n")
    sock.sendall(head.encode() + body)
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-answer: {answer!r}"
        answer += chunk
    return answer


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_http10_keep_alive_is_honoured_as_ab_k_asks(system, users):
    """`ab -k` speaks HTTP/1.0 + `Connection: keep-alive`: two answers on one
    socket, each saying keep-alive. Without the header, HTTP/1.0 closes."""
    import socket
    alice, bob = users("alice"), users("bob")
    with socket.create_connection(("127.0.0.1", system.api_port), timeout=10 * S) as sock:
        for _ in range(2):
            answer = _http10(sock, system, alice, bob, keep_alive=True)
            assert answer.startswith(b"HTTP/1.1 201 ")
            assert b"\r\nconnection: keep-alive\r\n" in answer.lower()
    with socket.create_connection(("127.0.0.1", system.api_port), timeout=10 * S) as sock:
        answer = _http10(sock, system, alice, bob, keep_alive=False)
        assert answer.startswith(b"HTTP/1.1 201 ") and b"\r\nconnection: close\r\n" in answer.lower()
        assert sock.recv(1) == b""  # the server closed it
    assert len(mysql_rows(system, "sender = :s", s=alice)) == 3


# The app's lifespan freezes the GC, adds GC callbacks and owns pools, and the
# first scenario replaces its loop's default executor: each runs in a child
# process of its own, on a loop of its own, and returns what it saw.


def _in_child(scenario, dbs, **stores):
    stores = {"mysql_url": dbs.mariadb.url(), "mongo_url": dbs.ferretdb.url, **stores}
    # A Pool, whose exit terminates the child: a scenario that hangs fails the
    # test (ProcessPoolExecutor's exit waited for it, and CI with it).
    with multiprocessing.get_context("spawn").Pool(1) as child:
        return child.apply_async(_run, (scenario, stores)).get(timeout=2 * PATIENCE)


def _run(scenario, stores: dict):
    settings = Settings(stores=StoresSettings(**stores), auth=AuthSettings(jwt_secret="s" * 32))
    return asyncio.run(scenario(settings))


def _headers(settings: Settings, user: str) -> dict:
    return {"Authorization": f"Bearer {auth.mint(settings.auth.jwt_secret.get_secret_value(), user, 60)}"}


async def _reads_with_the_default_executor_stuck(settings: Settings) -> dict:
    headers = _headers(settings, "stuckme")
    async with api_in_process(settings) as client:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        loop.set_default_executor(ThreadPoolExecutor(1))
        holder = loop.run_in_executor(None, release.wait, PATIENCE)  # the default executor's only thread, taken
        try:
            async with asyncio.timeout(10 * S):
                answers = {path: await client.get(path, params=params, headers=headers) for path, params in
                           (("/v1/messages", {"with": "stuckpeer"}), ("/v1/conversations", None), ("/readyz", None))}
            still_stuck = not holder.done()
        finally:
            release.set()
            await holder
    return {"still_stuck": still_stuck, **{path: (a.status_code, a.json()) for path, a in answers.items()}}


def test_reads_answer_while_the_default_executor_is_stuck(dbs):
    """History, conversations and /readyz run their MySQL calls on threads of
    the API's own (db.threads), never in asyncio's default executor: PyMongo
    opens its connections there (loop.getaddrinfo), so our slow reads in it
    held the writer's Mongo inserts back (a CI run waited 3 s). With the
    default executor stuck, the reads still answer."""
    seen = _in_child(_reads_with_the_default_executor_stuck, dbs)
    assert seen["still_stuck"]  # all answered while the default executor was still stuck
    assert seen["/v1/messages"] == (200, {"messages": [], "next_before": None})
    assert seen["/v1/conversations"] == (200, {"conversations": []})
    status, ready = seen["/readyz"]
    assert ready["checks"]["mysql"] == "ok"  # (its Mongo check may fail: the driver could not connect)


async def _reads_behind_a_table_lock(settings: Settings) -> dict:
    headers = _headers(settings, "lockme")
    started, release = [], threading.Event()

    def count(conn, cursor, statement, parameters, context, executemany):
        if "lockpeer" in str(parameters):
            started.append(parameters)

    def keep_the_thread(context):
        # MariaDB ends each read at the timeout (max_statement_time), about when
        # its request's deadline passes: the thread is kept until every answer is
        # in, so that no read thread can come free before the queued reads are answered.
        if "lockpeer" in str(context.parameters):
            release.wait(PATIENCE)

    event.listen(Engine, "before_cursor_execute", count)
    event.listen(Engine, "handle_error", keep_the_thread)
    locker = create_engine(settings.stores.mysql_url.get_secret_value())
    try:
        async with api_in_process(settings) as client:
            with locker.connect() as conn:
                conn.execute(text("LOCK TABLES messages WRITE"))
                try:
                    async with asyncio.timeout(10 * S):  # a read queued behind the held threads would never come
                        answers = await asyncio.gather(*(
                            client.get("/v1/messages", params={"with": f"lockpeer{i}"}, headers=headers)
                            for i in range(12)))
                    ran = len(started)
                    threads = sum(t.name.startswith("reads") for t in threading.enumerate())  # db.threads' names
                finally:
                    release.set()
                    conn.execute(text("UNLOCK TABLES"))
    finally:
        locker.dispose()
        event.remove(Engine, "before_cursor_execute", count)
        event.remove(Engine, "handle_error", keep_the_thread)
    return {"threads": threads, "ran": ran, "answers": [(a.status_code, a.json()["error"], a.headers.get("retry-after"))
                                                        for a in answers]}


def test_reads_stuck_behind_a_table_lock_get_a_503_at_their_deadline_not_a_queue(dbs):
    """A burst of history reads while MySQL makes them wait (another session
    holds a WRITE lock on `messages`), more than the API has read threads:
    each is answered 503 + Retry-After at its deadline, also the ones that
    queued for a thread, which they never got: every thread was still taken
    when the last answer came."""
    seen = _in_child(_reads_behind_a_table_lock, dbs, db_timeout_seconds=1.0)
    assert seen["threads"] < 12  # (6: a thread per connection of the read engine) some reads queued
    assert seen["answers"] == [(503, "mysql_unavailable", "1")] * 12
    assert seen["ran"] <= seen["threads"]  # the queued ones were answered without ever running
