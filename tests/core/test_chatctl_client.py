"""The reference client's pure rules: what it resumes with, what it drops as a repeat, where a 421 or a 1012
sends it (asking the API's client-config too), what it does with signals (typing, presence) and whom it
watches; how `chatctl listen --format text` shows each frame; and the requests `chatctl` makes of the write
API (against a stand-in for httpx: what it sends, what it prints, its exit status)."""

import asyncio
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson
import pytest
from typer.testing import CliRunner
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from chat import auth
from chatctl import render
from chatctl.cli import app
from chatctl.client import (Inbox, listen, next_route, partition_from_api, partition_of_config,
                            partition_of_refusal)
from tests.timing import S

AT = "2026-11-26T08:00:00.123Z"


def message(msg_id: str, cursor: str | None = None) -> dict:
    frame = {"type": "message", "id": msg_id, "from": "ann", "to": "ben", "body": "x"}
    return frame if cursor is None else {**frame, "cursor": cursor}


def test_it_resumes_with_the_frames_cursor_when_there_is_one_else_the_id():
    inbox = Inbox()
    inbox.accept({"type": "hello", "cursor": "1.2.5", "recovered": False})
    assert inbox.accept(message("6", "1.2.6"))
    assert inbox.since == "1.2.6"
    assert inbox.query() == "since=1.2.6"
    single = Inbox()
    assert single.accept(message("7"))
    assert single.since == "7"


def test_after_recovered_false_the_ids_of_another_partition_are_new_messages():
    inbox = Inbox("0.0.3")
    for n in (1, 2, 3):
        inbox.accept(message(str(n)))
    # The user's slot moved: partition 1 numbers its own messages from 1 again.
    inbox.accept({"type": "hello", "cursor": "1.1.0", "recovered": False})
    assert inbox.accept(message("1", "1.1.1")) and inbox.accept(message("2", "1.1.2"))
    assert inbox.accept(message("2", "1.1.2")) is False and inbox.duplicates == 1  # a true repeat still drops
    assert inbox.ids == [1, 2, 3, 1, 2]


def test_a_421_names_the_partition_to_route_to():
    def refusal(status: int, body: object) -> InvalidStatus:
        return InvalidStatus(Response(status, "x", Headers(), orjson.dumps(body)))

    assert partition_of_refusal(refusal(421, {"error": "wrong_partition", "partition": 3})) == 3
    assert partition_of_refusal(refusal(503, {"error": "draining"})) is None
    assert partition_of_refusal(refusal(421, {"error": "wrong_partition"})) is None
    assert partition_of_refusal(refusal(421, {"partition": "3"})) is None
    inbox = Inbox(partition=3)
    assert inbox.query() == "partition=3"


def test_the_next_route_is_the_apis_answer_else_the_refusals_whichever_names_another_partition():
    assert next_route(0, 2, 1) == 2
    assert next_route(0, 0, 1) == 1  # the API names the route that failed: the refusal's
    assert next_route(0, None, 1) == 1  # the API cannot tell
    assert next_route(0, None, 0) == 0  # nothing new: the caller backs off
    assert next_route(None, None, None) is None
    assert next_route(None, 3, None) == 3  # a client that did not route learns its route


def test_client_config_names_the_partition():
    assert partition_of_config(200, b'{"ws_url": "ws://d/v1/ws", "partition": 2}') == 2
    assert partition_of_config(200, b'{"ws_url": "ws://d/v1/ws"}') is None  # asked without a token
    assert partition_of_config(401, b'{"error": "unauthorized", "partition": 2}') is None
    assert partition_of_config(200, b'{"partition": "2"}') is None
    assert partition_of_config(200, b'[2]') is None
    assert partition_of_config(502, b"<html>bad gateway</html>") is None


async def test_the_partition_is_asked_of_the_api_with_the_users_token():
    asked: list[httpx.Request] = []

    def api(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        return httpx.Response(200, json={"ws_url": "ws://d/v1/ws", "partition": 3})

    assert await partition_from_api("http://api.test", "tok", transport=httpx.MockTransport(api)) == 3
    assert [(str(r.url), r.headers["authorization"]) for r in asked] == [
        ("http://api.test/v1/client-config", "Bearer tok")]

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    assert await partition_from_api("http://api.test", "tok", transport=httpx.MockTransport(down)) is None


class PartitionedDaemon:
    """Plays the daemons behind a proxy: a handshake whose ``partition`` is in ``refuse`` gets 421
    naming ``refuse[k]`` (what that daemon's map says); any other gets a hello and the next
    message after its ``since``, then a 1012 close while ``close_with_1012`` says so."""

    def __init__(self, refuse: dict[str | None, int], close_with_1012: int = 0):
        self.refuse = refuse
        self.close_with_1012 = close_with_1012
        self.events: list[tuple] = []  # ("handshake", partition) ..., in order with the client's asks and sleeps

    def partition(self, request: Request) -> str | None:
        return parse_qs(urlsplit(request.path).query).get("partition", [None])[0]

    def process_request(self, connection: ServerConnection, request: Request):
        partition = self.partition(request)
        self.events.append(("handshake", partition))
        if partition in self.refuse:
            body = orjson.dumps({"error": "wrong_partition", "partition": self.refuse[partition]}).decode()
            return connection.respond(HTTPStatus.MISDIRECTED_REQUEST, body)
        return None

    async def handler(self, connection: ServerConnection) -> None:
        assert connection.request is not None
        after = int(parse_qs(urlsplit(connection.request.path).query).get("since", ["0"])[0])
        await connection.send(orjson.dumps({"type": "hello", "cursor": str(after), "recovered": True}).decode())
        await connection.send(orjson.dumps(message(str(after + 1))).decode())
        if self.close_with_1012 > 0:
            self.close_with_1012 -= 1
            await connection.close(1012, "restarting")
        else:
            await connection.wait_closed()


async def listen_to(daemon: PartitionedDaemon, api_says, count: int, partition: int | None = None,
                    ) -> tuple[list[dict], list[tuple]]:
    """What ``listen`` printed, and the daemon's handshakes in order with the client's API asks
    (``api_says()`` answers each) and backoff sleeps, and its route changes."""
    printed: list[dict] = []

    async def ask(token: str) -> int | None:
        daemon.events.append(("asked the API", token))
        return api_says()

    async def backoff(seconds: float) -> None:  # the client's backoff, recorded instead of waited
        daemon.events.append(("slept",))

    async with serve(daemon.handler, "127.0.0.1", 0, process_request=daemon.process_request) as server:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(10 * S):
            await listen(f"ws://127.0.0.1:{port}", "t", None, printed.append, count, sleep=backoff,
                         inbox=Inbox(partition=partition), ask_partition=ask,
                         on_route=lambda k, why: daemon.events.append(("routed", k, why)))
    return printed, daemon.events


async def test_closed_with_1012_it_asks_the_api_after_the_backoff_and_reconnects_where_it_says():
    # The user's slot moved from partition 0 to 1: its daemon closes its socket with 1012.
    daemon = PartitionedDaemon(refuse={}, close_with_1012=1)
    printed, events = await listen_to(daemon, lambda: 1, count=2, partition=0)
    assert events == [("handshake", "0"), ("slept",), ("asked the API", "t"), ("routed", 1, "the API"),
                      ("handshake", "1")]
    assert [m["id"] for m in printed] == ["1", "2"]  # resumed after the first


async def test_closed_with_1012_and_the_api_unreachable_or_unchanged_it_reconnects_to_its_route():
    for says in (None, 0):
        daemon = PartitionedDaemon(refuse={}, close_with_1012=1)
        _, events = await listen_to(daemon, lambda says=says: says, count=2, partition=0)
        assert events == [("handshake", "0"), ("slept",), ("asked the API", "t"), ("handshake", "0")]


async def test_refused_with_421_it_follows_the_api_before_the_421_at_once():
    # A daemon still on the old map names the route that failed; the API, on the new one, partition 2.
    daemon = PartitionedDaemon(refuse={"0": 0})
    _, events = await listen_to(daemon, lambda: 2, count=1, partition=0)
    assert events == [("handshake", "0"), ("asked the API", "t"), ("routed", 2, "the API"), ("handshake", "2")]


async def test_refused_with_421_and_the_api_unreachable_it_follows_the_421_at_once():
    daemon = PartitionedDaemon(refuse={None: 1})
    _, events = await listen_to(daemon, lambda: None, count=1)
    assert events == [("handshake", None), ("asked the API", "t"), ("routed", 1, "a 421"), ("handshake", "1")]


async def test_refused_with_421_naming_the_route_that_failed_with_the_api_agreeing_it_backs_off():
    daemon = PartitionedDaemon(refuse={"1": 1})
    answers = iter([1, 0])  # then the map moves the user to partition 0

    _, events = await listen_to(daemon, lambda: next(answers), count=1, partition=1)
    assert events == [("handshake", "1"), ("asked the API", "t"), ("slept",),
                      ("handshake", "1"), ("asked the API", "t"), ("routed", 0, "the API"), ("handshake", "0")]


EDIT = {"type": "edit", "id": "9", "from": "ann", "to": "ben", "ref": "7", "body": "y", "created_at": AT,
        "client_msg_id": None}
READ = {"type": "read", "id": "10", "from": "ben", "to": "ann", "upto": "7", "created_at": AT, "cursor": "0.1.10"}
ERROR = {"type": "error", "code": "past_newest", "message": "99 is past the newest id", "frame": "ack"}
TYPING = {"type": "typing", "from": "ann", "to": "ben", "state": "start", "ttl": 5}
SNAPSHOT = {"type": "presence", "users": [{"user": "ann", "online": True, "last_seen": None},
                                          {"user": "cy", "online": False, "last_seen": AT},
                                          {"user": "dee", "online": False, "last_seen": None}]}


def test_events_are_positions_of_the_stream_as_messages_are():
    inbox = Inbox()
    assert inbox.accept(message("7")) and inbox.accept(EDIT) and inbox.accept(READ)
    assert inbox.ids == [7, 9, 10] and inbox.since == "0.1.10"
    assert inbox.accept(EDIT) is False and inbox.duplicates == 1  # a repeated event drops as a message does


def test_an_error_frame_is_passed_on_and_moves_nothing():
    inbox = Inbox()
    inbox.accept(message("7"))
    assert inbox.accept(ERROR) is True
    assert inbox.ids == [7] and inbox.since == "7" and inbox.duplicates == 0


def test_signals_are_passed_on_each_time_and_move_nothing():
    inbox = Inbox()
    inbox.accept(message("7"))
    for frame in (TYPING, TYPING, SNAPSHOT, {"type": "presence", "user": "ann", "online": False, "last_seen": AT}):
        assert inbox.accept(frame) is True  # no id: never a repeat, never a resume point
    assert inbox.ids == [7] and inbox.since == "7" and inbox.duplicates == 0


async def test_listen_watches_after_each_hello_and_passes_signals_on():
    """Against a daemon played here: the first connection says who is online and who types, then
    drops; the second carries a message. Each is told whom to watch after its hello."""
    watched: list[dict] = []
    connections = 0

    async def daemon(connection: ServerConnection) -> None:
        nonlocal connections
        connections += 1
        await connection.send(orjson.dumps({"type": "hello", "cursor": "0", "recovered": True}).decode())
        watched.append(orjson.loads(await connection.recv()))
        if connections == 1:
            for frame in (SNAPSHOT, TYPING):
                await connection.send(orjson.dumps(frame).decode())
            await connection.close(1012, "restarting")
        else:
            await connection.send(orjson.dumps(message("1")).decode())
            await connection.wait_closed()

    async def no_backoff(seconds: float) -> None:
        pass

    printed: list[dict] = []
    async with serve(daemon, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with asyncio.timeout(10 * S):
            await listen(f"ws://127.0.0.1:{port}", "t", None, printed.append, 1, sleep=no_backoff,
                         watch=["ann", "cy"])
    assert watched == [{"type": "watch", "users": ["ann", "cy"]}] * 2
    assert printed == [SNAPSHOT, TYPING, message("1")]  # the signals counted for nothing in `count`


@pytest.mark.parametrize("frame,shown", [
    ({**message("7"), "created_at": AT}, f"#7 {AT} ann -> ben: x"),
    ({**message("7"), "created_at": AT, "body": "y", "edited_at": AT}, f"#7 {AT} ann -> ben: y (edited)"),
    ({**message("7"), "created_at": AT, "body": "", "edited_at": AT, "deleted": True},
     f"#7 {AT} ann -> ben: (deleted)"),
    ({**message("7"), "created_at": AT, "body": "two\nlines\x07"}, f"#7 {AT} ann -> ben: two\\nlines\\u0007"),
    (EDIT, f"#9 {AT} ann edited #7: y"),
    ({"type": "delete", "id": "11", "from": "ann", "to": "ben", "ref": "7", "created_at": AT, "client_msg_id": "d1"},
     f"#11 {AT} ann deleted #7"),
    (READ, f"#10 {AT} ben read ann's messages up to #7"),
    ({"type": "delivered", "id": "12", "from": "ben", "to": "ann", "upto": "7", "created_at": AT},
     f"#12 {AT} ben received ann's messages up to #7"),
    (ERROR, "refused ack: past_newest: 99 is past the newest id"),
    ({"type": "reaction", "id": "13", "from": "ann"}, '{"type":"reaction","id":"13","from":"ann"}'),
    (TYPING, "ann is typing to ben (5 s)"),
    ({**TYPING, "ttl": 1.5}, "ann is typing to ben (1.5 s)"),
    ({**TYPING, "state": "stop"}, "ann stopped typing to ben"),
    ({"type": "presence", "user": "ann", "online": True, "last_seen": None}, "ann is online"),
    ({"type": "presence", "user": "ann", "online": False, "last_seen": AT}, f"ann is offline, last seen {AT}"),
    ({"type": "presence", "user": "ann", "online": False, "last_seen": None}, "ann is offline"),
    (SNAPSHOT, f"watching: ann online; cy last seen {AT}; dee offline"),
    ({"type": "presence", "users": []}, "watching nobody"),
], ids=["message", "edited", "deleted", "control characters", "edit", "delete", "read", "delivered", "error",
        "unknown type", "typing", "typing, a fraction of a second", "typing stopped", "online", "offline",
        "offline, never seen or hidden", "presence snapshot", "watching nobody"])
def test_listen_as_text_shows_each_frame_on_one_line(frame, shown):
    assert render.line(frame) == shown


def test_listen_as_text_says_the_unread_count_of_each_connection():
    hello = {"type": "hello", "recovered": True, "cursor": "7", "user": "ben"}
    assert render.hello_line({**hello, "unread": 3}) == "connected as ben, 3 unread"
    assert render.hello_line({**hello, "unread": None}) == "connected as ben, unread count unknown"


SECRET = "s" * 48
ENV = {"CHAT_JWT_SECRET": SECRET, "CHAT_DEV_MODE": "false"}
API = "http://api.test"


@pytest.fixture
def answered(monkeypatch):
    """The requests chatctl makes, answered with ``answered.reply`` (or raising it, an exception)."""
    sent: list[httpx.Request] = []

    class Answers:
        reply: httpx.Response | Exception = httpx.Response(200, json={})
        requests = sent

    def request(method: str, url: str, **kwargs) -> httpx.Response:
        built = httpx.Request(method, url, json=kwargs.get("json"), params=kwargs.get("params"),
                              headers=kwargs.get("headers"))
        sent.append(built)
        if isinstance(Answers.reply, Exception):
            raise Answers.reply
        return Answers.reply

    monkeypatch.setattr(httpx, "request", request)
    return Answers


def chatctl(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV, catch_exceptions=False)


@pytest.mark.parametrize("args,method,path,body", [
    (["read", "--as", "ben", "ann", "12"], "POST", "/v1/read", {"peer": "ann", "upto": "12"}),
    (["edit", "--as", "ann", "12", "hello again"], "PATCH", "/v1/messages/12", {"body": "hello again"}),
    (["edit", "--as", "ann", "12", "hi", "--client-msg-id", "e:1"], "PATCH", "/v1/messages/12",
     {"body": "hi", "client_msg_id": "e:1"}),
    (["delete", "--as", "ann", "12"], "DELETE", "/v1/messages/12", None),
    (["delete", "--as", "ann", "12", "--client-msg-id", "d:1"], "DELETE", "/v1/messages/12?client_msg_id=d%3A1",
     None),
    (["ack", "--as", "ben", "12"], "POST", "/v1/acks", {"upto": "12"}),
    (["ack", "--as", "ben", "12", "--device", "phone-1"], "POST", "/v1/acks", {"upto": "12", "device": "phone-1"}),
    (["send", "--as", "ann", "ben", "hi"], "POST", "/v1/messages", {"to": "ben", "body": "hi"}),
    (["edit", "--as", "ann", "1/2", "x"], "PATCH", "/v1/messages/1%2F2", {"body": "x"}),  # one path segment
    (["device", "register", "--as", "ben", "phone-1", "--platform", "android", "--app-id", "chat.example",
      "--pushkey", "pk1"], "POST", "/v1/devices",
     {"device": "phone-1", "platform": "android", "app_id": "chat.example", "pushkey": "pk1"}),
    (["device", "register", "--as", "ben", "phone-1", "--platform", "web", "--app-id", "chat.example",
      "--pushkey", "https://push.example/s/1", "--data", '{"url": "https://push.example/notify"}'], "POST",
     "/v1/devices", {"device": "phone-1", "platform": "web", "app_id": "chat.example",
                     "pushkey": "https://push.example/s/1", "data": {"url": "https://push.example/notify"}}),
    (["device", "register", "--as", "ben", "phone-1", "--platform", "ios", "--app-id", "a", "--pushkey", "k",
      "--data", "[1]"], "POST", "/v1/devices",  # JSON, not an object: the API's to refuse
     {"device": "phone-1", "platform": "ios", "app_id": "a", "pushkey": "k", "data": [1]}),
    (["device", "list", "--as", "ben"], "GET", "/v1/devices", None),
    (["device", "remove", "--as", "ben", "phone-1"], "DELETE", "/v1/devices/phone-1", None),
    (["device", "remove", "--as", "ben", "a/b"], "DELETE", "/v1/devices/a%2Fb", None),  # one path segment
    (["device", "remove", "--as", "ben", ".."], "DELETE", "/v1/devices/%2E%2E", None),  # a device id, not the parent
    (["device", "remove", "--as", "ben", "."], "DELETE", "/v1/devices/%2E", None),
    (["device", "remove", "--as", "ben", "a..b"], "DELETE", "/v1/devices/a..b", None),
    (["typing", "--as", "ann", "ben"], "POST", "/v1/typing", {"to": "ben", "state": "start"}),
    (["typing", "--as", "ann", "ben", "--stop"], "POST", "/v1/typing", {"to": "ben", "state": "stop"}),
    (["presence", "--as", "ben", "ann", "cy"], "GET", "/v1/presence?users=ann%2Ccy", None),
    (["presence", "--as", "ben", "ann,cy", "dee"], "GET", "/v1/presence?users=ann%2Ccy%2Cdee", None),
], ids=["read", "edit", "edit, idempotent", "delete", "delete, idempotent", "ack", "ack of a device", "send",
        "an id that is not one", "device register", "device register with data", "device register, data a list",
        "device list", "device remove", "device remove, an id that is not one", "device remove, ..",
        "device remove, .", "device remove, dots within", "typing", "typing stopped", "presence",
        "presence, by commas"])
def test_each_command_makes_its_request_as_the_user_and_prints_the_answer(answered, args, method, path, body):
    answered.reply = httpx.Response(201, json={"type": "event", "id": "13"})
    done = chatctl(*args, "--api", API)
    assert done.exit_code == 0 and done.stdout == '{"type":"event","id":"13"}\n'
    (request,) = answered.requests
    assert (request.method, str(request.url)) == (method, API + path)
    assert (orjson.loads(request.content) if request.content else None) == body
    assert auth.verify(SECRET, auth.bearer(request.headers["authorization"])) == args[args.index("--as") + 1]


def test_a_refusal_is_printed_as_it_came_and_exits_1(answered):
    refusal = {"error": "not_in_conversation", "message": "12 is not between you and ann"}
    answered.reply = httpx.Response(403, json=refusal)
    done = chatctl("read", "--as", "ben", "ann", "12", "--api", API)
    assert done.exit_code == 1 and orjson.loads(done.stdout) == refusal


def test_an_api_that_does_not_answer_is_said_on_stderr(answered):
    answered.reply = httpx.ConnectError("connection refused")
    done = chatctl("ack", "--as", "ben", "12", "--api", API)
    assert done.exit_code == 1 and done.stdout == ""
    assert done.stderr == f"chatctl ack: POST {API}/v1/acks: connection refused\n"


def test_a_user_that_cannot_be_one_is_refused_before_any_request(answered):
    done = chatctl("delete", "--as", "not a user", "12", "--api", API)
    assert done.exit_code == 2 and "--as" in done.stderr and answered.requests == []


def test_a_removed_device_prints_nothing_and_exits_0(answered):
    answered.reply = httpx.Response(204)
    done = chatctl("device", "remove", "--as", "ben", "phone-1", "--api", API)
    assert (done.exit_code, done.stdout) == (0, "")


def test_a_device_refusal_is_printed_as_it_came_and_exits_1(answered):
    refusal = {"error": "too_many_devices", "message": "remove one first", "field": "device"}
    answered.reply = httpx.Response(409, json=refusal)
    done = chatctl("device", "register", "--as", "ben", "d11", "--platform", "ios", "--app-id", "a", "--pushkey",
                   "k", "--api", API)
    assert done.exit_code == 1 and orjson.loads(done.stdout) == refusal


def test_device_data_that_is_not_json_is_refused_before_any_request(answered):
    done = chatctl("device", "register", "--as", "ben", "phone-1", "--platform", "ios", "--app-id", "a",
                   "--pushkey", "k", "--data", "{url: x}", "--api", API)
    assert done.exit_code == 2 and "--data" in done.stderr and answered.requests == []
