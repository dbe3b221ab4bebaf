"""The write API answers as its OpenAPI document says, checked by schemathesis
against the real API process: requests it draws from the document (valid ones,
invalid ones, methods the document does not list), and, made here on purpose,
the answers a generator rarely reaches (413, 429, dev login's). Every answer
must be declared for its operation, with the declared content type, body
schema and headers; a request the document calls valid must be taken, and one
it calls invalid refused."""

from __future__ import annotations

import httpx
import orjson
import pytest
import schemathesis
from schemathesis import checks

from api.openapi import OPENAPI
from harness.system import running_system
from tests.timing import PATIENCE

CONFORMANCE = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
               checks.response_headers_conformance, checks.response_schema_conformance]
# The document states the API's rules (api.openapi), and a 405 names the methods a path takes.
CHECKS = [*CONFORMANCE, checks.positive_data_acceptance, checks.negative_data_rejection, checks.unsupported_method]

# Deterministic: the same requests on every run (a seed, no example database
# kept between runs). 50 fuzzed examples per operation, besides the coverage
# phase's boundary values and undeclared methods: under 400 requests in all.
# An invalid request is refused with any 4xx of schemathesis' list, or with
# 413: a body drawn past its maxLength can be over the request's byte limit
# too, and the API refuses the size before it reads the fields.
REFUSALS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
CONFIG = schemathesis.Config.from_dict({
    "seed": 20_251,
    "generation": {"max-examples": 50, "deterministic": True, "database": "none"},
    "request-timeout": PATIENCE,  # (its default, 10 s, is no limit of ours)
    "checks": {"negative_data_rejection": {"expected-statuses": REFUSALS}},
    # An ack or a read marker past the newest id of the caller's stream is well-formed and refused,
    # 422 past_newest (docs/receipts.md): schemathesis' positive data is not all acceptable there.
    "operations": [{"include-path": ["/v1/acks", "/v1/read"], "checks": {"positive_data_acceptance": {
        "expected-statuses": ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]}}}],
})
# The document the API serves, as JSON (tests/e2e/test_api_ops.py checks that it is this one).
SCHEMA = schemathesis.openapi.from_dict(orjson.loads(orjson.dumps(OPENAPI)), config=CONFIG)
DEV_TOKEN = "/v1/dev/token"
CHECKER = "schema-checker"


@pytest.fixture(scope="module")
def dev_api(dbs):
    """An API with dev login on, as `make run` serves it, so that POST /v1/dev/token is
    more than its 404; a sender may post once, then gets 429."""
    with running_system(dbs, daemons=0, apis=1, CHAT_DEV_MODE="true", CHAT_DEV_LOGIN="true",
                        CHAT_RATE_LIMIT_PER_SECOND="0.001", CHAT_RATE_LIMIT_BURST="1") as s:
        yield s


@SCHEMA.parametrize()
def test_every_answer_is_one_the_document_declares(case, system, request):
    api = request.getfixturevalue("dev_api") if case.path == DEV_TOKEN else system
    case.call_and_validate(base_url=api.api_url, headers={"Authorization": f"Bearer {api.token(CHECKER)}"},
                           checks=CHECKS)


def bearer(api, user: str = CHECKER) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token(user)}"}


OVER_16_KIB = b'{"to": "bob", "user": "bob", "body": "' + b"x" * 17_000 + b'"}'
ANSWERS = {
    # name: (API, method, path, request, status, error code)
    "message body too large": ("system", "POST", "/v1/messages", {"content": OVER_16_KIB, "auth": True}, 413,
                               "body_too_large"),
    "dev login body too large": ("dev_api", "POST", DEV_TOKEN, {"content": OVER_16_KIB}, 413, "body_too_large"),
    "dev login malformed JSON": ("dev_api", "POST", DEV_TOKEN, {"content": b'{"user": '}, 400, "malformed_json"),
    "dev login not a user id": ("dev_api", "POST", DEV_TOKEN, {"json": {"user": "a b"}}, 422, "invalid_field"),
    "dev login": ("dev_api", "POST", DEV_TOKEN, {"json": {"user": "alice"}}, 200, None),
    "dev login off": ("system", "POST", DEV_TOKEN, {"json": {"user": "alice"}}, 404, "not_found"),
    "history with= empty": ("system", "GET", "/v1/messages", {"params": {"with": ""}, "auth": True}, 422,
                            "invalid_field"),
    "history limit=0": ("system", "GET", "/v1/messages", {"params": {"with": "bob", "limit": "0"}, "auth": True},
                        422, "invalid_field"),
    "history without token": ("system", "GET", "/v1/messages", {"params": {"with": "bob"}}, 401, "unauthorized"),
    "conversations, bad token": ("system", "GET", "/v1/conversations",
                                 {"headers": {"Authorization": "Bearer x.y.z"}}, 401, "unauthorized"),
    "client-config, bad token": ("system", "GET", "/v1/client-config",
                                 {"headers": {"Authorization": "Bearer x.y.z"}}, 401, "unauthorized"),
    # Typing and presence (docs/presence.md)
    "typing": ("system", "POST", "/v1/typing", {"json": {"to": "bob", "state": "stop"}, "auth": True}, 202, None),
    "typing, bad state": ("system", "POST", "/v1/typing", {"json": {"to": "bob", "state": "paused"}, "auth": True},
                          422, "invalid_field"),
    "presence": ("system", "GET", "/v1/presence", {"params": {"users": "alice,bob,alice"}, "auth": True}, 200, None),
    "presence of 201 users": ("system", "GET", "/v1/presence",
                              {"params": {"users": ",".join(f"u{i}" for i in range(201))}, "auth": True}, 422,
                              "invalid_field"),
    "presence settings": ("system", "GET", "/v1/presence/settings", {"auth": True}, 200, None),
    "presence shown": ("system", "PUT", "/v1/presence/settings", {"json": {"hidden": False}, "auth": True}, 200, None),
}


@pytest.mark.parametrize("api_name,method,path,sent,status,code", ANSWERS.values(), ids=ANSWERS.keys())
def test_answers_made_on_purpose_are_declared(request, api_name, method, path, sent, status, code):
    api = request.getfixturevalue(api_name)
    sent = dict(sent)
    headers = {**sent.pop("headers", {}), **(bearer(api) if sent.pop("auth", False) else {})}
    reply = httpx.request(method, f"{api.api_url}{path}", headers=headers, timeout=PATIENCE, **sent)
    assert reply.status_code == status and reply.json().get("error") == code, reply.text
    SCHEMA[path][method].Case().validate_response(reply, checks=CONFORMANCE)


def test_a_sender_over_the_rate_limit_gets_the_declared_429(dev_api, users):
    sender = users("sender")
    replies = [httpx.post(f"{dev_api.api_url}/v1/messages", json={"to": "bob", "body": f"m{i}"},
                          headers=bearer(dev_api, sender), timeout=PATIENCE) for i in range(2)]
    assert [r.status_code for r in replies] == [201, 429]  # a burst of 1
    assert replies[1].json()["error"] == "rate_limited" and int(replies[1].headers["retry-after"]) >= 1
    for reply in replies:
        SCHEMA["/v1/messages"]["POST"].Case().validate_response(reply, checks=CONFORMANCE)


def test_a_reused_client_msg_id_gets_the_declared_409(system, users):
    sender = users("sender")
    replies = [httpx.post(f"{system.api_url}/v1/messages", json={"to": "bob", "body": body, "client_msg_id": "c1"},
                          headers=bearer(system, sender), timeout=PATIENCE) for body in ("a", "b")]
    assert [r.status_code for r in replies] == [201, 409]
    assert replies[1].json()["error"] == "client_msg_id_conflict"
    for reply in replies:
        SCHEMA["/v1/messages"]["POST"].Case().validate_response(reply, checks=CONFORMANCE)
