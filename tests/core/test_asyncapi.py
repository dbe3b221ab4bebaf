"""The AsyncAPI document of the push side (api/asyncapi.py): valid as the
AsyncAPI project's own parser judges it, and true to the frames the daemon
builds. The end-to-end tests check every frame they receive against it
(tests/e2e/conftest.py)."""

from __future__ import annotations

import asyncio
import copy
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import httpx
import orjson
import pytest
from jsonschema import Draft7Validator, ValidationError, validators

from api.app import create_app
from api import validation
from api.asyncapi import DEFAULT_DEVICE, document, schemas
from chat.errors import CloseCode
from chat.messages import Kind, Message, encode_doc, public
from chat.settings import ApiSettings, DaemonSettings, Settings, SignalsSettings
from chat.write_errors import ClientIdConflict, EditWindowClosed, NotSender, Outcome
from daemon import client_frames
from daemon.signals import Signals
from daemon.partitioning import with_cursor
from writer.client import WriterUnreachable
from tests.frame_contract import FRAME_SCHEMA, PRESENCE_SNAPSHOT, STREAM_FRAMES, violations
from tests.timing import S

ROOT = Path(__file__).resolve().parents[2]
PARSER = ROOT / ".cache" / "asyncapi"  # scripts/bootstrap.sh installs tests/asyncapi/package.json's pins there


def diagnostics(doc: dict) -> list[dict]:
    """What @asyncapi/parser says of ``doc``: severity 0 errors, 1 warnings, 2 information, 3 hints."""
    node = shutil.which("node")
    assert node and (PARSER / "node_modules" / "@asyncapi" / "parser").is_dir(), \
        "node and @asyncapi/parser are needed: run `make bootstrap`"
    done = subprocess.run([node, str(ROOT / "tests/asyncapi/validate.mjs"), str(PARSER)], input=orjson.dumps(doc),
                          capture_output=True, timeout=60 * S, check=True)
    return orjson.loads(done.stdout)


def test_the_asyncapi_parser_finds_no_error_and_no_warning_in_the_document():
    found = diagnostics(document(Settings()))
    assert [d for d in found if d["severity"] <= 1] == []
    # the only note: 3.1 exists; the document keeps to 3.0, which more tools read
    assert {d["code"] for d in found} <= {"asyncapi-latest-version"}


def test_the_parser_reports_a_message_that_is_not_there():
    broken = copy.deepcopy(document(Settings()))
    broken["channels"]["ws"]["messages"]["hello"] = {"$ref": "#/components/messages/Nowhere"}
    assert any(d["severity"] == 0 for d in diagnostics(broken))


def test_every_close_code_the_daemons_send_is_documented_once():
    codes = document(Settings())["channels"]["ws"]["x-close-codes"]
    assert [c["code"] for c in codes] == [int(c) for c in CloseCode]
    assert all(c["meaning"] for c in codes)


def test_the_frames_the_daemon_builds_match_the_document():
    created = datetime(2026, 11, 26, 8, 0, 0, 123000, tzinfo=UTC)
    doc = {"_id": 7, "from": "alice", "to": "bob", "body": "hé", "created_at": created, "client_msg_id": "c-1"}
    payload = encode_doc(doc)[-1]
    assert violations(orjson.loads(payload)) == []
    assert violations(orjson.loads(with_cursor(payload, "2.1.7"))) == []  # several partitions: a cursor on each
    assert violations(public(8, "bob", "alice", "x", created, None)) == []
    hello = {"type": "hello", "recovered": True, "cursor": "0.1.7", "user": "bob", "unread": 3}
    assert violations(hello) == []
    # as daemon/routes.py joins it, with a typing event that came while it waited
    typing = orjson.dumps({"type": "typing", "from": "alice", "to": "bob", "state": "start",
                           "ttl": Settings().signals.typing_ttl_seconds})
    answer = b'{"messages":[' + payload + b'],"cursor":"7","recovered":true,"unread":0,"signals":[' + typing + b"]}"
    assert violations(orjson.loads(answer), "PollAnswer") == []


@pytest.mark.parametrize("kind,edited,deleted", [
    (Kind.MESSAGE, True, False), (Kind.MESSAGE, True, True), (Kind.MESSAGE, False, True),
    (Kind.EDIT, False, False), (Kind.DELETE, False, False), (Kind.READ, False, False), (Kind.DELIVERED, False, False),
], ids=["edited", "edited and deleted", "deleted", "edit", "delete", "read", "delivered"])
def test_the_events_and_revised_messages_the_daemon_builds_match_the_document(kind, edited, deleted):
    created = datetime(2026, 11, 26, 8, 0, 0, 123000, tzinfo=UTC)
    row = Message(9, "alice", "bob", "hé" if kind in (Kind.MESSAGE, Kind.EDIT) else "", created,
                  "c-1" if kind in (Kind.MESSAGE, Kind.EDIT, Kind.DELETE) else None, kind=kind,
                  ref_id=None if kind == Kind.MESSAGE else 7, edited_at=created if edited else None, deleted=deleted)
    payload = encode_doc(row.to_doc())[-1]  # as a daemon sends it from the oplog
    frame = orjson.loads(payload)
    assert frame["type"] == FRAME_SCHEMA_TYPES[kind] and violations(frame) == []
    assert frame == row.to_public()  # as the API answers it
    assert violations(orjson.loads(with_cursor(payload, "2.1.9"))) == []
    answer = b'{"messages":[' + payload + b'],"cursor":"9","recovered":true,"unread":null,"signals":[]}'
    assert violations(orjson.loads(answer), "PollAnswer") == []


FRAME_SCHEMA_TYPES = {Kind.MESSAGE: "message", Kind.EDIT: "edit", Kind.DELETE: "delete", Kind.READ: "read",
                      Kind.DELIVERED: "delivered"}


AT = "2026-11-26T08:00:00.123Z"
# One of each frame docs/receipts.md names, as a daemon sends it.
FRAMES = {
    "message": {"type": "message", "id": "7", "from": "a", "to": "b", "body": "x", "created_at": AT,
                "client_msg_id": None},
    "edited message": {"type": "message", "id": "7", "from": "a", "to": "b", "body": "y", "created_at": AT,
                       "client_msg_id": "c1", "edited_at": AT},
    "tombstone": {"type": "message", "id": "7", "from": "a", "to": "b", "body": "", "created_at": AT,
                  "client_msg_id": None, "edited_at": AT, "deleted": True},
    "edit": {"type": "edit", "id": "9", "from": "a", "to": "b", "ref": "7", "body": "y", "created_at": AT,
             "client_msg_id": "e1"},
    "delete": {"type": "delete", "id": "10", "from": "a", "to": "b", "ref": "7", "created_at": AT,
               "client_msg_id": None},
    "read": {"type": "read", "id": "11", "from": "b", "to": "a", "upto": "7", "created_at": AT},
    "delivered": {"type": "delivered", "id": "12", "from": "b", "to": "a", "upto": "7", "created_at": AT,
                  "cursor": "1.2.12"},
    "hello, unread unknown": {"type": "hello", "recovered": False, "cursor": "0", "user": "u", "unread": None},
    "error": {"type": "error", "code": "not_in_conversation", "message": "7 is not between you and carol",
              "frame": "read"},
}
# One of each signal docs/presence.md names, as a daemon sends it.
SIGNALS = {
    "typing": {"type": "typing", "from": "a", "to": "b", "state": "start", "ttl": 5},
    "typing, a ttl of a fraction": {"type": "typing", "from": "a", "to": "b", "state": "start", "ttl": 0.5},
    "typing stopped": {"type": "typing", "from": "a", "to": "b", "state": "stop", "ttl": 5},
    "presence snapshot": {"type": "presence", "users": [{"user": "a", "online": True, "last_seen": None},
                                                        {"user": "b", "online": False, "last_seen": AT},
                                                        {"user": "c", "online": False, "last_seen": None}]},
    "presence snapshot of nobody": {"type": "presence", "users": []},
    "online": {"type": "presence", "user": "a", "online": True, "last_seen": None},
    "offline": {"type": "presence", "user": "a", "online": False, "last_seen": AT},
    "offline, hidden": {"type": "presence", "user": "a", "online": False, "last_seen": None},
    "watch refused": {"type": "error", "code": "watch_too_many", "message": "at most 200", "frame": "watch"},
    "typing refused": {"type": "error", "code": "signals_unavailable", "message": "Redis away", "frame": "typing"},
    "unknown type": {"type": "error", "code": "unknown_type", "message": "no such frame", "frame": "reaction"},
}


@pytest.mark.parametrize("frame", [*FRAMES.values(), *SIGNALS.values()], ids=[*FRAMES, *SIGNALS])
def test_each_frame_of_the_contract_matches_the_document(frame):
    assert violations(frame) == []


def test_a_poll_answer_carries_the_typing_that_came_while_it_waited():
    answer = {"messages": [FRAMES["message"]], "cursor": "7", "recovered": True, "unread": 0}
    assert violations({**answer, "signals": [SIGNALS["typing"], SIGNALS["typing stopped"]]}, "PollAnswer") == []
    assert violations({**answer, "signals": []}, "PollAnswer") == []
    without = violations(answer, "PollAnswer")
    assert without and "signals" in without[0]  # always there, empty when nothing came
    found = violations({**answer, "signals": [{**SIGNALS["typing"], "id": "8"}]}, "PollAnswer")
    assert found and all("/signals/0" in v for v in found), found  # a signal has no place in the stream


def test_a_poll_answer_carries_every_frame_of_the_stream_and_the_unread_count():
    stream = [FRAMES[name] for name in ("message", "tombstone", "edit", "delete", "read", "delivered")]
    assert violations({"messages": stream, "cursor": "12", "recovered": True, "unread": 2, "signals": []},
                      "PollAnswer") == []
    assert violations({"messages": [], "cursor": "12", "recovered": True, "unread": None, "signals": []},
                      "PollAnswer") == []
    without = violations({"messages": [], "cursor": "12", "recovered": True, "signals": []}, "PollAnswer")
    assert without and "unread" in without[0]


@pytest.mark.parametrize("item,wrong", [
    ({**FRAMES["read"], "upto": 7}, "Read at /messages/1/upto"),
    ({**FRAMES["edit"], "ref": None}, "Edit at /messages/1/ref"),
    ({**FRAMES["delivered"], "extra": 1}, "Delivered at /messages/1: Additional properties"),
    (FRAMES["error"], "/messages/1: not a frame of the stream"),
    ({"type": "typing"}, "/messages/1: not a frame of the stream"),
])
def test_a_poll_answer_names_the_frame_that_differs_by_its_own_type(item, wrong):
    found = violations({"messages": [FRAMES["message"], item], "cursor": "12", "recovered": True, "unread": 0,
                        "signals": []},
                       "PollAnswer")
    assert found and all(wrong in v for v in found), found


def test_every_frame_the_daemon_sends_on_the_socket_is_checked_by_its_type():
    doc = document(Settings())
    sent = [m["$ref"] for op in doc["operations"].values() if op["action"] == "send"
            and op["channel"]["$ref"] == "#/channels/ws" for m in op["messages"]]
    channel = doc["channels"]["ws"]["messages"]
    kinds: dict[str, set[str]] = {}
    for ref in sent:
        name = channel[ref.rsplit("/", 1)[1]]["$ref"].rsplit("/", 1)[1]
        kinds.setdefault(doc["components"]["schemas"][name]["properties"]["type"]["const"], set()).add(name)
    assert kinds == {kind: {name} for kind, name in FRAME_SCHEMA.items()} | {
        "presence": {FRAME_SCHEMA["presence"], PRESENCE_SNAPSHOT}}
    assert set(STREAM_FRAMES) == set(FRAME_SCHEMA) - {"hello", "error", "typing", "presence"}


def test_the_client_frames_are_documented_with_their_fields():
    doc = document(Settings())
    received = {m["$ref"].rsplit("/", 1)[1] for op in doc["operations"].values() if op["action"] == "receive"
                for m in op["messages"]}
    assert received == {"auth", "ack", "readMarker", "typingNotice", "watch"}
    frames = schemas(Settings())
    for name, frame, valid in [
        ("TypingNotice", {"type": "typing", "to": "alice", "state": "start"}, True),
        ("TypingNotice", {"type": "typing", "to": "alice", "state": "stop"}, True),
        ("TypingNotice", {"type": "typing", "to": "alice"}, True),  # a start
        ("TypingNotice", {"type": "typing", "to": "alice", "state": "paused"}, False),
        ("TypingNotice", {"type": "typing", "to": "a b"}, False),
        ("TypingNotice", {"type": "typing", "state": "start"}, False),
        ("TypingNotice", {"type": "typing", "to": "alice", "ttl": 5}, False),
        ("Watch", {"type": "watch", "users": ["alice", "bob"]}, True),
        ("Watch", {"type": "watch", "users": []}, True),  # clears the list
        ("Watch", {"type": "watch", "users": "alice"}, False),
        ("Watch", {"type": "watch", "users": ["a b"]}, False),
        ("Watch", {"type": "watch"}, False),
        ("Watch", {"type": "watch", "users": [f"u{i}" for i in range(201)]}, False),  # an error frame, not a close

        ("Ack", {"type": "ack", "upto": "7"}, True),
        ("Ack", {"type": "ack", "upto": 7}, False),
        ("Ack", {"type": "ack"}, False),
        ("ReadMarker", {"type": "read", "peer": "alice", "upto": "7"}, True),
        ("ReadMarker", {"type": "read", "upto": "7"}, False),
        ("ReadMarker", {"type": "read", "peer": "alice", "upto": "7", "more": 1}, False),
    ]:
        assert Draft7Validator(frames[name]).is_valid(frame) == valid, (name, frame)
    # A malformed one is closed with 1007, which the document says.
    (invalid,) = [c for c in doc["channels"]["ws"]["x-close-codes"] if c["code"] == CloseCode.INVALID_DATA]
    assert all(f"`{kind}`" in invalid["meaning"] for kind in ("ack", "read", "typing", "watch"))


def test_the_handshake_names_the_device_an_ack_counts_for():
    device = document(Settings())["channels"]["ws"]["bindings"]["ws"]["query"]["properties"]["device"]
    assert device["default"] == "default"
    for value, valid in [("phone-1", True), ("a.b_c", True), ("x" * 64, True), ("x" * 65, False), ("", False),
                         ("a b", False), ("é", False)]:
        assert (re.search(device["pattern"], value) is not None) == valid, value


@pytest.mark.parametrize("frame,wrong", [
    ({"type": "hello", "recovered": "yes", "cursor": "1", "user": "u"}, "recovered"),
    ({"type": "hello", "recovered": True, "cursor": "1", "user": "u", "extra": 1}, "extra"),
    ({"type": "message", "id": "7", "from": "a", "to": "b", "body": "x", "created_at": "2026-11-26T08:00:00Z",
      "client_msg_id": None}, "created_at"),
    ({"type": "message", "id": 7, "from": "a", "to": "b", "body": "x", "created_at": "2026-11-26T08:00:00.000Z",
      "client_msg_id": None}, "id"),
    ({"type": "reaction"}, "no documented type"),
    ({"type": "hello", "recovered": True, "cursor": "1", "user": "u"}, "unread"),
    ({"type": "hello", "recovered": True, "cursor": "1", "user": "u", "unread": -1}, "unread"),
    ({"type": "hello", "recovered": True, "cursor": "1", "user": "u", "unread": "3"}, "unread"),
    ({**FRAMES["tombstone"], "body": "still here"}, "body"),
    ({**FRAMES["tombstone"], "deleted": False}, "deleted"),
    ({**FRAMES["edited message"], "edited_at": "yesterday"}, "edited_at"),
    ({k: v for k, v in FRAMES["edit"].items() if k != "ref"}, "ref"),
    ({k: v for k, v in FRAMES["delete"].items() if k != "client_msg_id"}, "client_msg_id"),
    ({**FRAMES["read"], "ref": "7"}, "ref"),
    ({**FRAMES["delivered"], "upto": "seven"}, "upto"),
    ({**FRAMES["error"], "code": "unknown"}, "code"),
    ({**FRAMES["error"], "frame": "message"}, "frame"),
    ({**SIGNALS["watch refused"], "frame": "reaction"}, "frame"),  # only unknown_type names other frames
    ({**SIGNALS["typing"], "id": "8"}, "Additional properties"),  # no place in the stream
    ({**SIGNALS["typing"], "cursor": "0.1.8"}, "Additional properties"),
    ({**SIGNALS["typing"], "state": "paused"}, "state"),
    ({**SIGNALS["typing"], "ttl": 0}, "ttl"),
    ({k: v for k, v in SIGNALS["typing"].items() if k != "from"}, "from"),
    ({**SIGNALS["online"], "last_seen": AT}, "last_seen"),  # online: no last_seen
    ({**SIGNALS["offline"], "last_seen": "2026-11-26T13:01:02Z"}, "last_seen"),
    ({k: v for k, v in SIGNALS["offline"].items() if k != "last_seen"}, "last_seen"),
    ({"type": "presence", "users": [{"user": "a", "online": True}]}, "PresenceSnapshot at /users/0"),
    ({"type": "presence", "users": [{**SIGNALS["online"]}]}, "PresenceSnapshot at /users/0"),  # no `type` inside
    ({"type": "presence", "user": "a", "online": "yes", "last_seen": None}, "PresenceChange at /online"),
])
def test_a_frame_unlike_the_document_is_named_with_what_differs(frame, wrong):
    found = violations(frame)
    assert found and any(wrong in v for v in found), found


def test_the_document_follows_the_limits_a_process_is_given():
    doc = document(Settings(api=ApiSettings(body_max_chars=10), daemon=DaemonSettings(poll_max_messages=5),
                            signals=SignalsSettings(presence_watch_max=7)))
    schemas = doc["components"]["schemas"]
    assert schemas["Message"]["properties"]["body"]["maxLength"] == 10
    assert schemas["PollAnswer"]["properties"]["messages"]["maxItems"] == 5
    assert schemas["Watch"]["properties"]["users"]["maxItems"] == 7
    assert schemas["PresenceSnapshot"]["properties"]["users"]["maxItems"] == 7


async def test_the_api_serves_the_document_beside_openapi():
    settings = Settings(api=ApiSettings(body_max_chars=10))
    app = create_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        served = await client.get("/asyncapi.json")
        declared = (await client.get("/openapi.json")).json()["paths"]
    assert served.status_code == 200 and served.headers["content-type"] == "application/json"
    assert served.json() == orjson.loads(orjson.dumps(document(settings)))
    assert "/asyncapi.json" in declared


def _search(validator, regex, instance, schema):
    """JSON Schema's `pattern` as ECMA-262 means it: `$` is the end of the text (Python's also matches
    before a final newline)."""
    if validator.is_type(instance, "string") and re.search(
            regex.removesuffix("$") + r"\Z" if regex.endswith("$") else regex, instance) is None:
        yield ValidationError(f"{instance!r} does not match {regex!r}")


EcmaValidator = validators.extend(Draft7Validator, {"pattern": _search})
UPTOS = ["7", "07", "0", "", "-1", "+1", " 7", "7 ", "7\n", "1e3", "7.0", "٣", "²", "9223372036854775807",
         "9223372036854775808", "0000000000000000001", "00000000000000000001", 7, None, True]


@pytest.mark.parametrize("frame", [
    *({"type": "ack", "upto": upto} for upto in UPTOS),
    *({"type": "read", "peer": "alice", "upto": upto} for upto in UPTOS),
    *({"type": "read", "peer": peer, "upto": "7"} for peer in ["a.b-c_d", "A" * 64, "A" * 65, "", "a b", "é",
                                                                "bob\n", 7, None]),
    {"type": "ack"}, {"type": "read", "upto": "7"}, {"type": "ack", "upto": "7", "device": "x"},
    {"type": "read", "peer": "alice", "upto": "7", "more": 1}, {"type": "ack", "peer": "alice", "upto": "7"},
    {"type": "auth", "token": "t"}, {"type": "typing"}, {"upto": "7"}, [], "ack",
    *({"type": "typing", "to": to} for to in ["alice", "a.b-c_d", "A" * 64, "A" * 65, "", "a b", "é", "bob\n", 7,
                                              None]),
    *({"type": "typing", "to": "alice", "state": state} for state in ["start", "stop", "Start", "", None, 1]),
    {"type": "typing", "state": "start"}, {"type": "typing", "to": "alice", "ttl": 5},
    {"type": "typing", "to": "alice", "from": "bob"},
    *({"type": "watch", "users": users} for users in [[], ["alice"], ["alice", "bob", "alice"],
                                                      [f"u{i}" for i in range(200)], ["a b"], ["alice", 7], [None],
                                                      "alice", {"alice": 1}, None]),
    {"type": "watch"}, {"type": "watch", "users": [], "more": 1}, {"type": "reaction"}, {"type": 7},
])
def test_the_client_frames_documented_are_those_the_daemon_takes(frame):
    kinds = {"ack": "Ack", "read": "ReadMarker", "typing": "TypingNotice", "watch": "Watch"}
    schema = kinds.get(frame.get("type")) if isinstance(frame, dict) else None
    documented = schema is not None and EcmaValidator(schemas(Settings())[schema]).is_valid(frame)
    try:
        parsed = client_frames.parse(orjson.dumps(frame))  # None: dropped; Unknown: answered unknown_type
    except client_frames.BadClientFrame:
        parsed = None
    taken = isinstance(parsed, client_frames.Ack | client_frames.Read | client_frames.Typing | client_frames.Watch)
    assert documented == taken


@pytest.mark.parametrize("frame,code,refused", [
    ({"type": "reaction", "ref": "7"}, "unknown_type", "reaction"),
    ({"type": "auth", "token": "t"}, "unknown_type", "auth"),  # after the hello, no more a frame it takes
    ({"type": "x" * 40}, "unknown_type", "x" * 32),
    ({"type": "watch", "users": ["alice", "bob", "carol"]}, "watch_too_many", "watch"),
], ids=["unknown type", "auth after the hello", "a long unknown type", "watch over the most"])
def test_each_refusal_of_a_signal_or_an_unknown_frame_is_a_documented_error_frame(frame, code, refused):
    sent: list[bytes] = []
    # all a refusal of the list reads
    signals = SimpleNamespace(settings=Settings(signals=SignalsSettings(presence_watch_max=2)))
    frames = client_frames.ClientFrames("bob", "phone-1", None, sent.append, signals=cast(Signals, signals))
    frames.take(orjson.dumps(frame))
    (answer,) = [orjson.loads(data) for data in sent]
    assert (answer["code"], answer["frame"]) == (code, refused)
    assert violations(answer) == []


@pytest.mark.parametrize("frame", [{"type": "typing", "to": "alice"}, {"type": "watch", "users": ["alice"]}],
                         ids=["typing", "watch"])
def test_signals_on_a_daemon_without_redis_are_a_documented_error_frame(frame):
    sent: list[bytes] = []
    client_frames.ClientFrames("bob", "phone-1", None, sent.append).take(orjson.dumps(frame))
    (answer,) = [orjson.loads(data) for data in sent]
    assert (answer["code"], answer["frame"]) == ("signals_unavailable", frame["type"])
    assert violations(answer) == []


@pytest.mark.parametrize("device", ["phone-1", "a.b_c", "x" * 64, "x" * 65, "", "a b", "é", "a/b", "a\n"])
def test_the_handshake_device_documented_is_the_one_the_daemon_takes(device):
    query = document(Settings())["channels"]["ws"]["bindings"]["ws"]["query"]["properties"]["device"]
    assert EcmaValidator(query).is_valid(device) == (client_frames.device_of(device) is not None)
    assert client_frames.device_of(None) == query["default"] == DEFAULT_DEVICE == validation.DEFAULT_DEVICE




def _failures() -> list:
    """An exception of each refusal the writer may answer an ack or a read marker with (not the edits' and
    deletes' own: not_sender, edit_window_closed, client_msg_id_conflict)."""
    theirs = {NotSender, EditWindowClosed, ClientIdConflict}
    found = [pytest.param(o.raises(o.reason), id=o.raises.__name__,
                          )
             for o in Outcome if o.raises is not None and o.raises not in theirs]
    return [*found, pytest.param(WriterUnreachable("writer: away"), id="WriterUnreachable")]


@pytest.mark.parametrize("failure", _failures())
@pytest.mark.parametrize("kind", ["ack", "read"])
async def test_each_refusal_of_a_client_frame_is_a_documented_error_frame(kind, failure):
    sent: list[bytes] = []
    refused = asyncio.Event()

    async def submit(draft):
        raise failure

    def send_text(data: bytes) -> None:
        sent.append(data)
        refused.set()

    frames = client_frames.ClientFrames("bob", "phone-1", submit, send_text)
    frames.take(orjson.dumps({"type": "ack", "upto": "7"} if kind == "ack" else
                             {"type": "read", "peer": "alice", "upto": "7"}))
    await asyncio.wait_for(refused.wait(), 10 * S)
    (frame,) = [orjson.loads(data) for data in sent]
    assert frame["frame"] == kind
    assert violations(frame) == []
