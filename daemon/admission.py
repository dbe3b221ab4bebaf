"""What the daemon decides about a request before serving it, with no I/O:
who the client is (its token), whether its origin may connect, whether the
daemon has room, and what its target and query ask for.

Refusals are ``chat.errors.Refused``: 401 bad token, 403 origin not allowed,
503 at capacity, starting or restarting, 422 a poll parameter out of range.
"""

from __future__ import annotations

import urllib.parse

from chat import auth
from chat.errors import Refused
from chat.parsing import is_decimal
from chat.settings import Settings
from daemon import metrics

MAX_ID = 2**63 - 1  # BSON's widest integer: a larger `since` cannot be looked up, so it is unknown


def credential(settings: Settings, query: dict[str, str], authorization: str | None) -> str | None:
    """The token a request carries: ``Authorization: Bearer``, else ``?token=``
    where ``url_tokens_allowed``; None when it carries none (a WebSocket then
    sends it in its first frame). A URL is written whole to proxies' error logs
    and browsers' history, so a token there is refused by default: 401."""
    token = auth.bearer(authorization)
    if token is not None or "token" not in query:
        return token
    if not settings.daemon.url_tokens_allowed:
        metrics.REJECTS.labels("auth").inc()
        raise Refused(401, "unauthorized", "a token in the URL is refused (proxies and browsers log URLs): send "
                      "`Authorization: Bearer`, or on /v1/ws an auth frame", headers={"WWW-Authenticate": "Bearer"})
    return query["token"]


def admit(settings: Settings, token: str | None, origin: str | None, *, open_connections: int,
          accepting: bool) -> tuple[str, float]:
    """The user and the token's ``exp`` (Unix time), decided before anything
    is registered; or ``Refused``. ``open_connections`` counts every open
    socket, this one included: handshakes under way and idle keep-alives hold
    file descriptors as much as WebSockets do. ``accepting``: the daemon is
    neither draining nor starting."""
    user, expires = verify(settings, token)
    admit_connection(settings, origin, open_connections=open_connections, accepting=accepting)
    return user, expires


def verify(settings: Settings, token: str | None) -> tuple[str, float]:
    """The user and the token's ``exp``, or ``Refused`` 401."""
    try:
        return auth.verify_until(settings.auth.jwt_secret.get_secret_value(), token)
    except auth.AuthError as exc:
        metrics.REJECTS.labels("auth").inc()
        raise Refused(401, "unauthorized", str(exc), headers={"WWW-Authenticate": "Bearer"}) from None


def admit_connection(settings: Settings, origin: str | None, *, open_connections: int, accepting: bool) -> None:
    """The checks that need no token (a WebSocket that sends its token in its
    first frame passes these at the handshake): its origin and the daemon's room."""
    if origin is not None and not origin_allowed(settings, origin):
        metrics.REJECTS.labels("origin").inc()
        raise Refused(403, "origin_not_allowed", f"origin {origin!r} is not allowed")
    if open_connections > settings.daemon.max_connections or not accepting:
        # Starting too: a client that waited here would wait out the stream's
        # start-up (seconds on FerretDB), where a retry may reach a ready daemon.
        metrics.REJECTS.labels("capacity").inc()
        raise Refused(503, "try_again_later", "this daemon is full, starting or restarting; retry",
                      headers={"Retry-After": "1"})


def preflight_headers(settings: Settings, origin: str | None) -> dict[str, str] | None:
    """The answer to a browser's CORS preflight of /v1/poll (it sends
    ``Authorization``, which is not a simple request's header); None: the
    origin is not allowed."""
    allowed = cors_headers(settings, origin)
    if not allowed:
        return None
    return allowed | {"Access-Control-Allow-Methods": "GET", "Access-Control-Allow-Headers": "Authorization",
                      "Access-Control-Max-Age": "600"}


def origin_allowed(settings: Settings, origin: str) -> bool:
    allowed = settings.daemon.allowed_origins
    return "*" in allowed or origin in allowed


def cors_headers(settings: Settings, origin: str | None) -> dict[str, str]:
    """Lets an allowed web page read poll answers (its fallback when a
    WebSocket cannot be held)."""
    if origin is None or not origin_allowed(settings, origin):
        return {}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


def parse_since(raw: str | None) -> int | None:
    """A resume point: a message id or a hello cursor (both decimal strings)."""
    if raw is None or not is_decimal(raw, 19) or int(raw) > MAX_ID:
        return None
    return int(raw)


def split_target(target: bytes) -> tuple[str, dict[str, str]]:
    """The path and the query of a request target, in either form (RFC 9112 section 3.2)."""
    text = target.decode("latin-1")
    if text.startswith("/"):  # origin form, as clients send: urlsplit was a twentieth of a long-poll's cost
        path, _, query = text.partition("?")
    else:  # absolute form ("http://host/path?query"), as a proxy may send
        url = urllib.parse.urlsplit(text)
        path, query = url.path, url.query
    return path, dict(urllib.parse.parse_qsl(query))


def poll_timeout(raw: str, limit: float) -> float:
    try:
        timeout = float(raw)
        if 0 <= timeout <= limit:
            return timeout
    except ValueError:
        pass
    raise Refused(422, "invalid_field", f"`timeout` must be seconds from 0 to {limit:g}", field="timeout")


def poll_limit(raw: str | None, most: int) -> int:
    if raw is None:
        return most
    if is_decimal(raw, 9) and 1 <= int(raw) <= most:
        return int(raw)
    raise Refused(422, "invalid_field", f"`limit` must be an integer from 1 to {most}", field="limit")
