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
from api.openapi import OPENAPI, document
from chat import serve
from chat.settings import Settings

DEFAULTS = Settings.model_fields
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
])
def test_user_id_patterns_take_what_the_api_takes(name, schema, parse, value):
    assert schema_accepts(schema, value) == api_accepts(parse, value), (name, value)


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
    most = DEFAULTS["body_max_chars"].default
    assert (body["minLength"], body["maxLength"]) == (1, most)
    for size in (0, 1, most, most + 1):
        assert api_accepts(validation.parse_message, message(body="é" * size), "alice", most) == (1 <= size <= most)


def test_the_document_follows_the_limits_a_process_is_given():
    doc = document(body_max_chars=10, request_max_bytes=1000)
    assert doc["components"]["schemas"]["NewMessage"]["properties"]["body"]["maxLength"] == 10
    assert "1000 bytes" in doc["paths"]["/v1/dev/token"]["post"]["responses"]["413"]["description"]


async def test_the_served_document_is_the_one_of_the_process_settings():
    app = create_app(Settings(body_max_chars=10, request_max_bytes=1000))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        served = (await client.get("/openapi.json")).json()
    assert served == orjson.loads(orjson.dumps(document(10, 1000)))


@pytest.mark.parametrize("schema,fields,required,parse", [
    (SCHEMAS["NewMessage"], validation.MESSAGE_FIELDS, ["to", "body"],
     lambda obj: validation.parse_message(orjson.dumps(obj), "alice", 4000)),
    (DEV_LOGIN, validation.DEV_LOGIN_FIELDS, ["user"], lambda obj: validation.parse_dev_login(orjson.dumps(obj))),
], ids=["message", "dev login"])
def test_body_fields_are_the_apis(schema, fields, required, parse):
    assert list(schema["properties"]) == list(fields) and schema["additionalProperties"] is False
    assert schema["required"] == required
    whole = {"to": "bob", "body": "x", "client_msg_id": "c1", "user": "bob"}
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
        assert set(declared(op, "422")[0]) == {"invalid_field", "invalid_body"}
    if op.get("security", [{}])[-1]:  # a token may be sent: parse_bearer
        codes, headers = declared(op, "401")
        assert codes == ["unauthorized"]
        assert headers["WWW-Authenticate"]["schema"] == {"type": "string", "const": "Bearer"}


def test_answers_with_retry_after_declare_it():
    post = PATHS["/v1/messages"]["post"]
    for status in ("429", "503"):
        assert declared(post, status)[1]["Retry-After"]["schema"] == {"type": "integer", "minimum": 1}
    assert declared(PATHS["/v1/messages"]["get"], "503")[0] == ["mysql_unavailable", "overloaded"]


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
