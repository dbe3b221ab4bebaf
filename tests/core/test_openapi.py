"""The OpenAPI document states the rules the API applies: each pattern, range,
length and field it gives takes exactly the values the validation takes, and
each operation declares the answers the HTTP layer and its route can give.
Also the 405 answer's `Allow`, on the app itself. No servers."""

from __future__ import annotations

import re

import httpx
import orjson
import pytest

from api import validation
from api.app import create_app
from api.errors import ApiError
from api.asyncapi import schemas as asyncapi_schemas
from api.openapi import OPENAPI, document, pattern
from chat import serve
from chat.settings import ApiSettings, Settings

PATHS = OPENAPI["paths"]
OPERATIONS = [(path, method, op) for path, ops in PATHS.items() for method, op in ops.items()]
SCHEMAS = OPENAPI["components"]["schemas"]


def resolve(node: dict) -> dict:
    """``node``, or what its ``$ref`` names in this document."""
    while "$ref" in node:
        *_, section, name = node["$ref"].split("/")
        node = OPENAPI["components"][section][name]
    return node


def schema_accepts(schema: dict, value: str) -> bool:
    """Whether a string meets ``schema``'s pattern as JSON Schema means it: a search in which `$`
    is the end of the text (Python's `$` also matches before a final newline; `\\Z` does not)."""
    regex = schema.get("pattern", "")  # none: any string
    return re.search(regex.removesuffix("$") + r"\Z" if regex.endswith("$") else regex, value) is not None


def api_accepts(parse, *args) -> bool:
    try:
        parse(*args)
    except ApiError as exc:
        assert exc.status in (400, 422), exc
        return False
    return True


def message(**fields) -> bytes:
    return orjson.dumps({"to": "bob", "body": "x", **fields})


def history_param(name: str) -> dict:
    (param,) = [p for p in PATHS["/v1/messages"]["get"]["parameters"] if p["name"] == name]
    return param


NEW_MESSAGE = SCHEMAS["NewMessage"]["properties"]
DEV_LOGIN = PATHS["/v1/dev/token"]["post"]["requestBody"]["content"]["application/json"]["schema"]
USER_IDS = ["a", "Z9", "a.b-c_d", "A" * 64, "A" * 65, "", "a b", "a:b", "a/b", "é", "bob\n", "\nbob", "\x00"]
CLIENT_IDS = [*USER_IDS, "a:b:c", ":" * 64, ":" * 65]


@pytest.mark.parametrize("value", USER_IDS)
@pytest.mark.parametrize("name,schema,parse", [
    ("to", NEW_MESSAGE["to"], lambda v: validation.parse_message(message(to=v), "alice", 4000)),
    ("with", history_param("with")["schema"], lambda v: validation.parse_history_query({"with": v})),
    ("user", DEV_LOGIN["properties"]["user"], lambda v: validation.parse_dev_login(orjson.dumps({"user": v}))),
    ("peer", SCHEMAS["ReadMarker"]["properties"]["peer"],
     lambda v: validation.parse_read(orjson.dumps({"peer": v, "upto": "1"}))),
])
def test_user_id_patterns_take_what_the_api_takes(name, schema, parse, value):
    assert schema_accepts(schema, value) == api_accepts(parse, value), (name, value)


@pytest.mark.parametrize("value", CLIENT_IDS)
def test_an_edits_and_a_deletes_client_msg_id_take_what_the_api_takes(value):
    edit = SCHEMAS["NewBody"]["properties"]["client_msg_id"]
    assert schema_accepts(edit, value) == api_accepts(
        validation.parse_edit, orjson.dumps({"body": "x", "client_msg_id": value}), 4000), value
    (_, query) = PATHS["/v1/messages/{id}"]["delete"]["parameters"]
    assert schema_accepts(query["schema"], value) == api_accepts(validation.client_msg_id_of, value), value


@pytest.mark.parametrize("value", CLIENT_IDS)
def test_client_msg_id_pattern_takes_what_the_api_takes(value):
    parse = validation.parse_message
    assert schema_accepts(NEW_MESSAGE["client_msg_id"], value) == api_accepts(
        parse, message(client_msg_id=value), "alice", 4000), value
    # null is "none given", in the schema's type as in the API
    assert "null" in NEW_MESSAGE["client_msg_id"]["type"] and api_accepts(parse, message(client_msg_id=None),
                                                                          "alice", 4000)


@pytest.mark.parametrize("name", ["limit", "before"])
def test_history_numbers_have_the_apis_range(name):
    schema = history_param(name)["schema"]
    assert schema["type"] == "integer"
    lo, hi = schema["minimum"], schema["maximum"]
    for value in (lo - 1, lo, hi, hi + 1, 10**19, 10**30):
        in_range = lo <= value <= hi
        assert api_accepts(validation.parse_history_query, {"with": "bob", name: str(value)}) == in_range, value
    if "default" in schema:
        assert validation.parse_history_query({"with": "bob"})[2] == schema["default"]


def test_history_parameters_are_the_apis():
    params = PATHS["/v1/messages"]["get"]["parameters"]
    assert [p["name"] for p in params] == list(validation.HISTORY_PARAMS)
    assert all(p["in"] == "query" for p in params)
    assert [p["name"] for p in params if p.get("required")] == ["with"]
    assert not api_accepts(validation.parse_history_query, {})
    assert not api_accepts(validation.parse_history_query, {"with": "bob", "page": "2"})  # no other parameter


def test_the_document_states_the_validation_constants():
    for schema in (NEW_MESSAGE["to"], history_param("with")["schema"], DEV_LOGIN["properties"]["user"]):
        assert schema["pattern"] == f"^(?:{validation.USER_ID.pattern})$"
    assert NEW_MESSAGE["client_msg_id"]["pattern"] == f"^(?:{validation.CLIENT_MSG_ID.pattern})$"
    limit, before = history_param("limit")["schema"], history_param("before")["schema"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (
        validation.HISTORY_LIMIT_MIN, validation.HISTORY_LIMIT_MAX, validation.HISTORY_LIMIT_DEFAULT)
    assert (before["minimum"], before["maximum"]) == (validation.BEFORE_MIN, validation.BEFORE_MAX)
    assert SCHEMAS["History"]["properties"]["messages"]["maxItems"] == validation.HISTORY_LIMIT_MAX


def test_message_body_length_is_the_apis():
    body = NEW_MESSAGE["body"]
    most = Settings.field("api.body_max_chars").default
    assert (body["minLength"], body["maxLength"]) == (1, most)
    for size in (0, 1, most, most + 1):
        assert api_accepts(validation.parse_message, message(body="é" * size), "alice", most) == (1 <= size <= most)


def test_the_document_follows_the_limits_a_process_is_given():
    doc = document(body_max_chars=10, request_max_bytes=1000)
    assert doc["components"]["schemas"]["NewMessage"]["properties"]["body"]["maxLength"] == 10
    assert "1000 bytes" in doc["paths"]["/v1/dev/token"]["post"]["responses"]["413"]["description"]


async def test_the_served_document_is_the_one_of_the_process_settings():
    app = create_app(Settings(api=ApiSettings(body_max_chars=10, request_max_bytes=1000)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        served = (await client.get("/openapi.json")).json()
    assert served == orjson.loads(orjson.dumps(document(10, 1000)))


@pytest.mark.parametrize("schema,fields,required,parse", [
    (SCHEMAS["NewMessage"], validation.MESSAGE_FIELDS, ["to", "body"],
     lambda obj: validation.parse_message(orjson.dumps(obj), "alice", 4000)),
    (DEV_LOGIN, validation.DEV_LOGIN_FIELDS, ["user"], lambda obj: validation.parse_dev_login(orjson.dumps(obj))),
    (SCHEMAS["NewBody"], validation.EDIT_FIELDS, ["body"], lambda obj: validation.parse_edit(orjson.dumps(obj), 4000)),
    (SCHEMAS["Ack"], validation.ACK_FIELDS, ["upto"], lambda obj: validation.parse_ack(orjson.dumps(obj))),
    (SCHEMAS["ReadMarker"], validation.READ_FIELDS, ["peer", "upto"],
     lambda obj: validation.parse_read(orjson.dumps(obj))),
    (SCHEMAS["NewDevice"], validation.DEVICE_FIELDS, ["device", "platform", "app_id", "pushkey"],
     lambda obj: validation.parse_device(orjson.dumps(obj))),
    (SCHEMAS["TypingNotice"], validation.TYPING_FIELDS, ["to"], lambda obj: validation.parse_typing(orjson.dumps(obj))),
    (SCHEMAS["PresenceSettings"], validation.PRESENCE_SETTINGS_FIELDS, ["hidden"],
     lambda obj: validation.parse_presence_settings(orjson.dumps(obj))),
], ids=["message", "dev login", "edit", "ack", "read", "device", "typing", "presence settings"])
def test_body_fields_are_the_apis(schema, fields, required, parse):
    assert list(schema["properties"]) == list(fields) and schema["additionalProperties"] is False
    assert schema["required"] == required
    whole = {"to": "bob", "body": "x", "client_msg_id": "c1", "user": "bob", "upto": "7", "device": "phone-1",
             "peer": "bob", "platform": "ios", "app_id": "chat.example", "pushkey": "k1", "data": {"a": 1},
             "state": "stop", "hidden": True}
    full = {name: whole[name] for name in fields}
    assert api_accepts(parse, full)
    assert not api_accepts(parse, {**full, "other": 1})
    for name in fields:
        without = {k: v for k, v in full.items() if k != name}
        assert api_accepts(parse, without) == (name not in required), name


def _head_answer(raw: bytes) -> tuple[str, str]:
    """(status, error code) of an answer the HTTP layer writes whole."""
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.split(b" ")[1].decode(), orjson.loads(body)["error"]


def declared(op: dict, status: str) -> tuple[list[str], dict]:
    """The error codes and the headers ``op`` declares for ``status``."""
    answer = op["responses"].get(status)
    assert answer is not None, f"{status} not declared"
    schema = answer["content"]["application/json"]["schema"]
    codes = [code for item in schema.get("allOf", []) for code in item.get("properties", {}).get("error", {})
             .get("enum", [])]
    headers = {name: resolve(header) for name, header in answer.get("headers", {}).items()}
    return codes, headers


@pytest.mark.parametrize("path,method,op", OPERATIONS, ids=[f"{m.upper()} {p}" for p, m, _ in OPERATIONS])
def test_each_operation_declares_the_answers_it_can_get(path, method, op):
    # The HTTP layer's, whatever the path: a head too large or too slow.
    for raw in (serve.HEAD_TOO_LARGE, serve.HEAD_TIMEOUT):
        status, code = _head_answer(raw)
        assert declared(op, status)[0] == [code]
    # At the connection limit every path but the probes' gets 503 overloaded + Retry-After.
    overloaded = path.encode() not in serve.HEALTH_PATHS
    assert ("503" in op["responses"] and "overloaded" in declared(op, "503")[0]) == overloaded  # (readyz's own 503)
    if overloaded:
        assert dict(serve.OVERLOADED_HEADERS)[b"retry-after"] == b"1"
        assert declared(op, "503")[1]["Retry-After"]["required"]
    if "requestBody" in op:  # read by read_body and parse_json
        assert declared(op, "413")[0] == ["body_too_large"]
        assert declared(op, "400")[0] == ["malformed_json"]
        assert {"invalid_field", "invalid_body"} <= set(declared(op, "422")[0])
    if op.get("security", [{}])[-1]:  # a token may be sent: parse_bearer
        codes, headers = declared(op, "401")
        assert codes == ["unauthorized"]
        assert headers["WWW-Authenticate"]["schema"] == {"type": "string", "const": "Bearer"}


def test_answers_with_retry_after_declare_it():
    post = PATHS["/v1/messages"]["post"]
    for status in ("429", "503"):
        assert declared(post, status)[1]["Retry-After"]["schema"] == {"type": "integer", "minimum": 1}
    assert declared(PATHS["/v1/messages"]["get"], "503")[0] == ["mysql_unavailable", "overloaded"]


def id_schema_accepts(schema: dict, value: object) -> bool:
    """Whether ``value`` meets a stream id's schema (a decimal string, or an integer) as JSON Schema means it."""
    string, integer = schema["anyOf"]
    if isinstance(value, str):
        return len(value) <= string["maxLength"] and schema_accepts(string, value)
    if isinstance(value, int) and not isinstance(value, bool):
        return integer["minimum"] <= value <= integer["maximum"]
    return False


STREAM_IDS = ["7", "07", "0", "", "-1", "+1", " 7", "7 ", "7\n", "1e3", "7.0", "٣", "²", "9223372036854775807",
              "9223372036854775808", "9999999999999999999", "0000000000000000001", "00000000000000000001",
              7, 0, -1, 2**63 - 1, 2**63, True, None, 7.0, [7]]


@pytest.mark.parametrize("value", STREAM_IDS, ids=repr)
@pytest.mark.parametrize("schema,parse", [
    (SCHEMAS["Ack"]["properties"]["upto"], lambda v: validation.parse_ack(orjson.dumps({"upto": v}))),
    (SCHEMAS["ReadMarker"]["properties"]["upto"],
     lambda v: validation.parse_read(orjson.dumps({"peer": "bob", "upto": v}))),
], ids=["ack", "read"])
def test_upto_takes_what_the_api_takes(schema, parse, value):
    assert id_schema_accepts(schema, value) == api_accepts(parse, value), value


@pytest.mark.parametrize("value", ["1", "07", "0", "-1", "abc", "9223372036854775807", "9223372036854775808"])
def test_the_path_id_takes_what_the_api_takes(value):
    schema = PATHS["/v1/messages/{id}"]["patch"]["parameters"][0]["schema"]
    documented = value.isdigit() and schema["minimum"] <= int(value) <= schema["maximum"]
    assert documented == api_accepts(validation.stream_id, value, "id"), value


@pytest.mark.parametrize("value", USER_IDS)
def test_device_pattern_takes_what_the_api_takes(value):
    schema = SCHEMAS["Ack"]["properties"]["device"]
    assert schema_accepts(schema, value) == api_accepts(
        validation.parse_ack, orjson.dumps({"upto": "1", "device": value})), value
    assert "null" in schema["type"] and validation.parse_ack(orjson.dumps({"upto": "1", "device": None}))[1] == \
        validation.DEFAULT_DEVICE


def test_an_edit_body_has_a_messages_length():
    body = SCHEMAS["NewBody"]["properties"]["body"]
    assert (body["minLength"], body["maxLength"]) == (NEW_MESSAGE["body"]["minLength"],
                                                      NEW_MESSAGE["body"]["maxLength"])
    most = Settings.field("api.body_max_chars").default
    for size in (0, 1, most, most + 1):
        assert api_accepts(validation.parse_edit, orjson.dumps({"body": "é" * size}), most) == (1 <= size <= most)


# docs/receipts.md, "Errors": each refusal of the receipts' endpoints, by operation and status. (An ack's
# `upto` is any position up to the newest, a message's or an event's: no 404.)
RECEIPT_REFUSALS = {
    ("/v1/acks", "post"): {"422": ["invalid_field", "invalid_body", "past_newest"]},
    ("/v1/read", "post"): {"403": ["not_in_conversation"], "404": ["message_not_found"], "409": ["message_deleted"],
                           "422": ["invalid_field", "invalid_body", "past_newest"]},
    ("/v1/messages/{id}", "patch"): {"403": ["not_sender"], "404": ["message_not_found"],
                                     "409": ["message_deleted", "edit_window_closed", "client_msg_id_conflict"],
                                     "422": ["invalid_field", "invalid_body"]},
    ("/v1/messages/{id}", "delete"): {"403": ["not_sender"], "404": ["message_not_found"],
                                      "409": ["message_deleted", "edit_window_closed", "client_msg_id_conflict"],
                                      "422": ["invalid_field"]},
}


@pytest.mark.parametrize("path,method", RECEIPT_REFUSALS, ids=[f"{m.upper()} {p}" for p, m in RECEIPT_REFUSALS])
def test_the_receipts_endpoints_declare_each_refusal_of_the_contract(path, method):
    op = PATHS[path][method]
    for status, codes in RECEIPT_REFUSALS[path, method].items():
        assert declared(op, status)[0] == codes, status
    # The writer or MySQL away, or the sender over its rate: the answers of a send, Retry-After included.
    for status in ("429", "503"):
        assert declared(op, status) == declared(PATHS["/v1/messages"]["post"], status)
    refusals = {s for s in op["responses"] if s.startswith(("4", "5"))}
    assert refusals == {*RECEIPT_REFUSALS[path, method], "401", "408", "429", "431", "503",
                        *(("400", "413") if "requestBody" in op else ())}


@pytest.mark.parametrize("path,method,schemas", [
    ("/v1/acks", "post", {"200": "AckAnswer"}),
    ("/v1/read", "post", {"200": "ReadAnswer"}),
    ("/v1/messages/{id}", "patch", {"201": "Edit", "200": "Edit"}),
    ("/v1/messages/{id}", "delete", {"201": "Delete", "200": "Delete"}),
])
def test_the_receipts_endpoints_answer_what_the_contract_says(path, method, schemas):
    op = PATHS[path][method]
    assert {s: op["responses"][s]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
            for s in op["responses"] if s.startswith("2")} == schemas
    if "201" in schemas:  # the event stored; a retry with the same client_msg_id: 200 and that event
        assert SCHEMAS[schemas["201"]]["properties"]["type"]["const"] == {"patch": "edit", "delete": "delete"}[method]


def test_the_id_in_the_path_is_a_message_id():
    for method in ("patch", "delete"):
        (param, *rest) = PATHS["/v1/messages/{id}"][method]["parameters"]
        assert (param["name"], param["in"], param["required"]) == ("id", "path", True)
        assert (param["schema"]["minimum"], param["schema"]["maximum"]) == (validation.BEFORE_MIN,
                                                                           validation.BEFORE_MAX)
    (client_msg_id,) = rest
    assert (client_msg_id["name"], client_msg_id["in"]) == ("client_msg_id", "query")
    assert client_msg_id["schema"]["pattern"] == NEW_MESSAGE["client_msg_id"]["pattern"]


def test_events_answered_are_the_frames_pushed():
    frames = asyncapi_schemas(Settings())
    for name in ("Edit", "Delete"):
        assert SCHEMAS[name]["required"] == frames[name]["required"]
        assert set(SCHEMAS[name]["properties"]) == set(frames[name]["properties"]) - {"cursor"}
    message = set(frames["Message"]["properties"]) - {"cursor"}
    assert set(SCHEMAS["Message"]["properties"]) == message
    assert SCHEMAS["Message"]["required"] == frames["Message"]["required"]


def test_each_conversation_has_its_unread_count_and_markers():
    item = SCHEMAS["Conversations"]["properties"]["conversations"]["items"]
    new = ["unread", "read_upto", "peer_read_upto", "peer_delivered_upto"]
    assert item["required"] == ["with", "last", *new]
    assert item["properties"]["unread"] == {**item["properties"]["unread"], "type": "integer", "minimum": 0}
    assert all(item["properties"][name]["type"] == ["string", "null"] for name in new[1:])


@pytest.mark.parametrize("method,path,allow", [
    ("DELETE", "/v1/messages", "GET, HEAD, POST"),  # two routes share the path
    ("PUT", "/v1/conversations", "GET, HEAD"),
    ("GET", "/v1/dev/token", "POST"),
    ("TRACE", "/healthz", "GET, HEAD"),
    ("POST", "/app/", "GET, HEAD"),  # the page's static files
])
async def test_405_names_the_methods_the_path_takes(method, path, allow):
    app = create_app(Settings())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        reply = await client.request(method, path)
    assert reply.status_code == 405 and reply.headers["allow"] == allow
    assert reply.json() == {"error": "method_not_allowed", "message": f"{method} is not allowed here"}


NEW_DEVICE = SCHEMAS["NewDevice"]["properties"]
REGISTRATION = {"device": "phone", "platform": "ios", "app_id": "chat.example", "pushkey": "k1"}


def registration(**fields) -> bytes:
    return orjson.dumps({**REGISTRATION, **fields})


def remove_accepts(value: str) -> bool:
    """Whether DELETE /v1/devices/{device} takes ``value`` as its id (api.devices.remove: DEVICE_ID)."""
    return validation.DEVICE_ID.fullmatch(value) is not None


DEVICE_PATH = PATHS["/v1/devices/{device}"]["delete"]["parameters"][0]


# Each field of a registration, with the values at and past its rule's edges.
DEVICE_FIELD_VALUES = {
    "device": USER_IDS,
    "platform": ["ios", "android", "web", "a", "x" * 16, "x" * 17, "", "IOS", "web push", "we.b", "w_e-b9", "ios\n",
                 "é"],
    "app_id": ["a", "chat.example", "A-b_c.9", "x" * 128, "x" * 129, "", "a b", "a:b", "a/b", "é", "a\n"],
    "pushkey": ["k", "https://push.example/send/abc?x=1", "!~", "k" * 512, "k" * 513, "", "a b", "a\tb", "\x7f",
                "é", "k\n"],
}


@pytest.mark.parametrize("name,value", [(n, v) for n, values in DEVICE_FIELD_VALUES.items() for v in values],
                         ids=repr)
def test_a_registrations_patterns_take_what_the_api_takes(name, value):
    assert schema_accepts(NEW_DEVICE[name], value) == api_accepts(
        validation.parse_device, registration(**{name: value})), (name, value)


@pytest.mark.parametrize("value", USER_IDS)
def test_the_device_in_the_path_takes_what_the_api_takes(value):
    assert schema_accepts(DEVICE_PATH["schema"], value) == remove_accepts(value), value
    assert (DEVICE_PATH["name"], DEVICE_PATH["in"], DEVICE_PATH["required"]) == ("device", "path", True)


def test_the_document_states_the_device_rules():
    assert NEW_DEVICE["device"]["pattern"] == DEVICE_PATH["schema"]["pattern"] == pattern(validation.DEVICE_ID)
    for name, rule in (("platform", validation.PLATFORM), ("app_id", validation.APP_ID),
                       ("pushkey", validation.PUSHKEY)):
        assert NEW_DEVICE[name]["pattern"] == pattern(rule), name
    assert f"{validation.DEVICE_DATA_MAX_BYTES} bytes" in NEW_DEVICE["data"]["description"]


@pytest.mark.parametrize("data,documented", [
    ({}, True), ({"url": "https://push.example/notify", "n": [1, {"x": None}]}, True), (None, True),
    ([1], False), ("x", False), (1, False), (True, False)], ids=repr)
def test_a_registrations_data_is_an_object_or_null_as_the_api_takes_it(data, documented):
    types = NEW_DEVICE["data"]["type"]
    kind = {dict: "object", type(None): "null"}.get(type(data), "other")
    assert (kind in types) == documented == api_accepts(validation.parse_device, registration(data=data))
    if data is None:  # none given: an empty object
        assert validation.parse_device(registration(data=None))[4] == {}


def test_data_past_its_byte_limit_is_refused_as_the_document_says():
    most = validation.DEVICE_DATA_MAX_BYTES
    fits = {"x": "y" * (most - len(b'{"x":""}'))}
    assert len(orjson.dumps(fits)) == most and api_accepts(validation.parse_device, registration(data=fits))
    assert not api_accepts(validation.parse_device, registration(data={"x": fits["x"] + "y"}))


# The device routes (api/devices.py): each refusal, by operation and status.
DEVICE_REFUSALS = {
    ("/v1/devices", "post"): {"409": ["too_many_devices"], "422": ["invalid_field", "invalid_body"],
                              "503": ["mysql_unavailable", "overloaded"]},
    ("/v1/devices", "get"): {"503": ["mysql_unavailable", "overloaded"]},
    ("/v1/devices/{device}", "delete"): {"404": ["device_not_found", "not_found"], "422": ["invalid_field"],
                                         "503": ["mysql_unavailable", "overloaded"]},
}


@pytest.mark.parametrize("path,method", DEVICE_REFUSALS, ids=[f"{m.upper()} {p}" for p, m in DEVICE_REFUSALS])
def test_the_device_endpoints_declare_each_refusal(path, method):
    op = PATHS[path][method]
    for status, codes in DEVICE_REFUSALS[path, method].items():
        assert declared(op, status)[0] == codes, status
    assert declared(op, "503")[1]["Retry-After"]["required"]
    refusals = {s for s in op["responses"] if s.startswith(("4", "5"))}
    assert refusals == {*DEVICE_REFUSALS[path, method], "401", "408", "431",
                        *(("400", "413") if "requestBody" in op else ())}


def test_the_device_endpoints_answer_what_the_api_answers():
    post, listing = PATHS["/v1/devices"]["post"], PATHS["/v1/devices"]["get"]
    assert {s: post["responses"][s]["content"]["application/json"]["schema"] for s in ("201", "200")} == {
        "201": {"$ref": "#/components/schemas/Device"}, "200": {"$ref": "#/components/schemas/Device"}}
    assert listing["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/Devices")
    assert "content" not in PATHS["/v1/devices/{device}"]["delete"]["responses"]["204"]
    # What api.devices answers for a device: the registration's fields and when it was made.
    assert SCHEMAS["Device"]["required"] == [*validation.DEVICE_FIELDS, "created_at"]
    assert SCHEMAS["Devices"]["properties"]["devices"]["items"] == {"$ref": "#/components/schemas/Device"}


# Typing and presence (docs/presence.md): each refusal, by operation and status.
SIGNAL_REFUSALS = {
    ("/v1/typing", "post"): {"422": ["invalid_field", "invalid_body"], "429": ["rate_limited"],
                             "503": ["signals_unavailable", "overloaded"]},
    ("/v1/presence", "get"): {"404": ["presence_disabled"], "422": ["invalid_field"],
                              "503": ["signals_unavailable", "mysql_unavailable", "overloaded"]},
    ("/v1/presence/settings", "get"): {"404": ["presence_disabled"], "503": ["mysql_unavailable", "overloaded"]},
    ("/v1/presence/settings", "put"): {"404": ["presence_disabled"], "422": ["invalid_field", "invalid_body"],
                                       "503": ["mysql_unavailable", "signals_unavailable", "overloaded"]},
}


@pytest.mark.parametrize("path,method", SIGNAL_REFUSALS, ids=[f"{m.upper()} {p}" for p, m in SIGNAL_REFUSALS])
def test_the_signal_endpoints_declare_each_refusal_of_the_contract(path, method):
    op = PATHS[path][method]
    for status, codes in SIGNAL_REFUSALS[path, method].items():
        assert declared(op, status)[0] == codes, status
    assert declared(op, "503")[1]["Retry-After"]["required"]
    refusals = {s for s in op["responses"] if s.startswith(("4", "5"))}
    assert refusals == {*SIGNAL_REFUSALS[path, method], "401", "408", "431",
                        *(("400", "413") if "requestBody" in op else ())}


@pytest.mark.parametrize("path,method,status,schema", [
    ("/v1/typing", "post", "202", "TypingAnswer"),
    ("/v1/presence", "get", "200", "Presence"),
    ("/v1/presence/settings", "get", "200", "PresenceSettings"),
    ("/v1/presence/settings", "put", "200", "PresenceSettings"),
])
def test_the_signal_endpoints_answer_what_the_contract_says(path, method, status, schema):
    op = PATHS[path][method]
    assert [s for s in op["responses"] if s.startswith("2")] == [status]
    assert op["responses"][status]["content"]["application/json"]["schema"] == {
        "$ref": f"#/components/schemas/{schema}"}


def test_presence_answered_is_the_presence_pushed():
    frames = asyncapi_schemas(Settings())
    entry = SCHEMAS["Presence"]["properties"]["users"]["items"]
    pushed = frames["PresenceSnapshot"]["properties"]["users"]["items"]
    assert entry["required"] == pushed["required"] and set(entry["properties"]) == set(pushed["properties"])
    assert SCHEMAS["TypingNotice"]["properties"]["state"]["enum"] == frames["TypingNotice"]["properties"]["state"][
        "enum"] == frames["Typing"]["properties"]["state"]["enum"]
    assert SCHEMAS["TypingNotice"]["required"] == ["to"] and "to" in frames["TypingNotice"]["required"]


USERS_PARAM = PATHS["/v1/presence"]["get"]["parameters"][0]
MOST = validation.PRESENCE_USERS_MAX


@pytest.mark.parametrize("value", [
    *USER_IDS, "alice,bob", "alice,bob,alice", ",".join(f"u{i}" for i in range(MOST)),
    ",".join(f"u{i}" for i in range(MOST + 1)), ",", "alice,", ",alice", "alice,,bob", ",,", "alice, bob",
    "alice;bob", "alice,a b",
], ids=repr)
def test_the_users_asked_about_are_what_the_api_takes(value):
    """1 to 200 user ids by commas; the API skips empty items (and counts a repeat once, which the pattern
    cannot: it counts each, so a list of more than 200 with repeats is the one case they differ on)."""
    assert (USERS_PARAM["name"], USERS_PARAM["in"], USERS_PARAM["required"]) == ("users", "query", True)
    assert schema_accepts(USERS_PARAM["schema"], value) == api_accepts(validation.parse_presence_users,
                                                                       {"users": value}), value
    assert not api_accepts(validation.parse_presence_users, {})


@pytest.mark.parametrize("value", USER_IDS)
def test_whom_one_types_to_takes_what_the_api_takes(value):
    schema = SCHEMAS["TypingNotice"]["properties"]["to"]
    assert schema_accepts(schema, value) == api_accepts(validation.parse_typing, orjson.dumps({"to": value})), value


@pytest.mark.parametrize("state", ["start", "stop", "Start", "", None, 1, True])
def test_a_typing_state_is_one_the_api_takes(state):
    documented = state in SCHEMAS["TypingNotice"]["properties"]["state"]["enum"]
    assert documented == api_accepts(validation.parse_typing, orjson.dumps({"to": "bob", "state": state})), state
    assert validation.parse_typing(orjson.dumps({"to": "bob"})) == ("bob", SCHEMAS["TypingNotice"]["properties"][
        "state"]["default"])


@pytest.mark.parametrize("hidden", [True, False, None, 0, 1, "true"])
def test_hiding_takes_a_boolean_as_the_api_does(hidden):
    documented = SCHEMAS["PresenceSettings"]["properties"]["hidden"]["type"] == "boolean" and type(hidden) is bool
    assert documented == api_accepts(validation.parse_presence_settings, orjson.dumps({"hidden": hidden}))
