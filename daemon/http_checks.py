"""What the daemon's HTTP refuses before routing, as the RFCs say to, with no I/O.

- A request line whose version is not HTTP/1.0 or 1.1: **505** (RFC 9110
  section 15.6.6). llhttp parses ``HTTP/0.9`` and ``HTTP/2.0`` request lines
  and rejects other versions itself ("Invalid HTTP version"); both get 505.
- An HTTP/1.1 request without ``Host``: **400** (RFC 9112 section 3.2).
- A WebSocket handshake whose method is not GET: **405** + ``Allow: GET``
  (RFC 6455 section 4.1: the handshake is a GET).
"""

from __future__ import annotations

from chat.errors import Refused

SUPPORTED_VERSIONS = ("1.1", "1.0")
UNSUPPORTED_VERSION = "this server speaks HTTP/1.1 (and HTTP/1.0)"
# llhttp's reasons for a request line it will not parse as HTTP/1.x: a version
# it does not know, and the HTTP/2 connection preface (`PRI * HTTP/2.0`).
PARSER_VERSION_ERRORS = ("Invalid HTTP version", "Pause on PRI/Upgrade")


def refusal(method: str, version: str, headers: dict[str, str], upgrade: bool) -> Refused | None:
    """Why a parsed request is refused before routing, or None to route it.
    ``headers`` has lower-case names."""
    if version not in SUPPORTED_VERSIONS:
        return Refused(505, "http_version_not_supported", UNSUPPORTED_VERSION)
    if version == "1.1" and "host" not in headers:
        return Refused(400, "bad_request", "an HTTP/1.1 request needs a Host header")
    if upgrade and method != "GET":
        return Refused(405, "method_not_allowed", f"a WebSocket handshake is a GET, not {method}",
                       headers={"Allow": "GET"})
    return None


def parser_refusal(reason: str) -> Refused:
    """The answer to a request llhttp could not parse, from its ``reason``."""
    if reason.startswith(PARSER_VERSION_ERRORS):
        return Refused(505, "http_version_not_supported", UNSUPPORTED_VERSION)
    return Refused(400, "bad_request", "malformed HTTP request")
