"""POST /v1/messages as a plain ASGI app: the route every message enters by.

It is the API's hot path, and Starlette's layers (two exception middlewares,
the router, the ``Request`` object, the response wrappers) were a fifth of
the API's CPU per message (py-spy --gil, ``ab -k -c 100``). So ``front``
hands this one route straight to ``PostMessage``, and everything else to
the Starlette app. The route is also in the Starlette routing table (the
same object), where it is documented and tested like every other; the
answers are the same either way: the same JSON errors, the same metrics.
"""

from __future__ import annotations

import logging
import time

import orjson
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from api import metrics
from api.errors import ApiError, rate_limited, write_refused
from api.state import State
from api.validation import parse_bearer, parse_message
from chat.errors import ChatError, error_body
from chat.parsing import is_decimal
from chat.write_errors import WRITE_FAILURES

log = logging.getLogger("chat.api")

PATH = "/v1/messages"
JSON = (b"content-type", b"application/json")
SERVER_ERROR = error_body("server_error", "internal error; retry with the same client_msg_id")


class Disconnected(ChatError):
    """The client left before its request body was read."""


class PostMessage:
    """ASGI app: stores one message (``writer.message_writer``, or the host's writer process) and answers 201, or 200
    for a retry with a known ``client_msg_id``; errors as in the README."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        try:
            status, body, headers = await self.store(scope["app"].state.chat, scope, receive)
        except ApiError as exc:
            metrics.ERRORS.labels(exc.code).inc()
            status, body = exc.status, exc.body()
            headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
        except Disconnected:
            return
        except Exception:
            log.exception("event=request_failed route=%s", PATH)
            status, body, headers = 500, SERVER_ERROR, []
        await send({"type": "http.response.start", "status": status,
                    "headers": [JSON, (b"content-length", b"%d" % len(body)), *headers]})
        await send({"type": "http.response.body", "body": body})
        metrics.REQUESTS.labels(PATH, str(status)).inc()
        metrics.POST_LATENCY.observe(time.perf_counter() - started)

    async def store(self, st: State, scope: Scope, receive: Receive) -> tuple[int, bytes, list]:
        authorization = content_length = None
        for name, value in scope["headers"]:  # the first of each, as Starlette's Headers.get
            if name == b"authorization" and authorization is None:
                authorization = value.decode("latin-1")
            elif name == b"content-length" and content_length is None:
                content_length = value.decode("latin-1")
        sender = parse_bearer(authorization, st.settings.auth.jwt_secret.get_secret_value())
        raw = await read_body(receive, content_length, st.settings.api.request_max_bytes)
        wait = st.limiter.allow(sender)
        if wait:
            raise rate_limited(wait)
        draft = parse_message(raw, sender, st.settings.api.body_max_chars)
        try:
            msg, created = await st.writer.submit(draft)
        except WRITE_FAILURES as exc:
            raise write_refused(exc) from None
        (metrics.MESSAGES_CREATED if created else metrics.MESSAGES_REPLAYED).inc()
        return (201 if created else 200), orjson.dumps(msg.to_public()), []


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed ``limit``."""
    if declared is not None and (not is_decimal(declared, 18) or int(declared) > limit):
        raise _too_big(limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_big(limit)  # read no further
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_big(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"request body is larger than {limit} bytes")


def front(app: Starlette, post: PostMessage) -> ASGIApp:
    """The app uvicorn serves: POST /v1/messages to ``post``, the rest (and the
    lifespan) to ``app``."""

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PATH and scope["method"] == "POST":
            scope["app"] = app
            await post(scope, receive, send)
        else:
            await app(scope, receive, send)

    return route
