"""The AsyncAPI document of the push side (api/asyncapi.py): valid as the
AsyncAPI project's own parser judges it, and true to the frames the daemon
builds. The end-to-end tests check every frame they receive against it
(tests/e2e/conftest.py)."""

from __future__ import annotations

import copy
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
import pytest

from api.app import create_app
from api.asyncapi import document
from chat.errors import CloseCode
from chat.messages import encode_doc, public
from chat.settings import Settings
from daemon.partitioning import with_cursor
from tests.frame_contract import violations
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
    hello = {"type": "hello", "recovered": True, "cursor": "0.1.7", "user": "bob"}
    assert violations(hello) == []
    answer = b'{"messages":[' + payload + b'],"cursor":"7","recovered":true}'  # as daemon/routes.py joins it
    assert violations(orjson.loads(answer), "PollAnswer") == []


@pytest.mark.parametrize("frame,wrong", [
    ({"type": "hello", "recovered": "yes", "cursor": "1", "user": "u"}, "recovered"),
    ({"type": "hello", "recovered": True, "cursor": "1", "user": "u", "extra": 1}, "extra"),
    ({"type": "message", "id": "7", "from": "a", "to": "b", "body": "x", "created_at": "2026-11-26T08:00:00Z",
      "client_msg_id": None}, "created_at"),
    ({"type": "message", "id": 7, "from": "a", "to": "b", "body": "x", "created_at": "2026-11-26T08:00:00.000Z",
      "client_msg_id": None}, "id"),
    ({"type": "typing"}, "no documented type"),
])
def test_a_frame_unlike_the_document_is_named_with_what_differs(frame, wrong):
    found = violations(frame)
    assert found and any(wrong in v for v in found), found


def test_the_document_follows_the_limits_a_process_is_given():
    doc = document(Settings(body_max_chars=10, poll_max_messages=5))
    schemas = doc["components"]["schemas"]
    assert schemas["Message"]["properties"]["body"]["maxLength"] == 10
    assert schemas["PollAnswer"]["properties"]["messages"]["maxItems"] == 5


async def test_the_api_serves_the_document_beside_openapi():
    settings = Settings(body_max_chars=10)
    app = create_app(settings)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
        served = await client.get("/asyncapi.json")
        declared = (await client.get("/openapi.json")).json()["paths"]
    assert served.status_code == 200 and served.headers["content-type"] == "application/json"
    assert served.json() == orjson.loads(orjson.dumps(document(settings)))
    assert "/asyncapi.json" in declared
