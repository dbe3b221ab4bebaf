"""The daemon's refusals before routing (daemon/http_checks.py), without sockets."""

import pytest

from chat.errors import Refused
from daemon.http_checks import parser_refusal, refusal

HOST = {"host": "chat.example"}
VERSION = (505, b'{"error":"http_version_not_supported","message":"this server speaks HTTP/1.1 (and HTTP/1.0)"}', {})


def answer(refused: Refused | None) -> tuple[int, bytes, dict[str, str]] | None:
    """What the client is sent: the status, the JSON body, the extra headers."""
    return None if refused is None else (refused.status, refused.body(), refused.headers)


@pytest.mark.parametrize("version", ["2.0", "0.9"])
def test_a_version_other_than_1_x_gets_505(version):
    assert answer(refusal("GET", version, HOST, upgrade=False)) == VERSION


def test_http_1_1_without_host_gets_400_and_http_1_0_needs_none():
    assert answer(refusal("GET", "1.1", {}, upgrade=False)) == (
        400, b'{"error":"bad_request","message":"an HTTP/1.1 request needs a Host header"}', {})
    assert refusal("GET", "1.0", {}, upgrade=False) is None
    assert refusal("GET", "1.1", HOST, upgrade=False) is None


@pytest.mark.parametrize("method", ["POST", "PUT", "CONNECT"])
def test_a_handshake_by_another_method_than_get_gets_405_allow_get(method):
    refused = refusal(method, "1.1", HOST, upgrade=True)
    assert refused.status == 405 and refused.headers == {"Allow": "GET"}
    assert refusal("GET", "1.1", HOST, upgrade=True) is None
    assert refusal("POST", "1.1", HOST, upgrade=False) is None  # routing answers a plain POST (405 or 404)


def test_parser_errors_about_the_version_get_505_and_others_400():
    assert answer(parser_refusal("Invalid HTTP version")) == VERSION
    assert answer(parser_refusal("Pause on PRI/Upgrade")) == VERSION  # the HTTP/2 preface
    assert parser_refusal("Invalid method encountered").status == 400
