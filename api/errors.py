"""The write API's error answers: ``chat.errors.Refused`` as a Starlette response."""

from __future__ import annotations

from starlette.responses import Response

from chat.errors import ChatError, Refused
from chat.write_errors import answer_for


class ApiError(Refused):
    def response(self) -> Response:
        return Response(self.body(), self.status, self.headers, media_type="application/json")


def write_refused(exc: ChatError, field: str | None = None) -> ApiError:
    """A write's failure as the API answers it (its ``Outcome``'s answer); ``field``
    replaces the field the outcome names (an event's refusal names `upto` or `id`)."""
    answer = answer_for(exc)
    headers = None if answer.retry_after is None else {"Retry-After": str(answer.retry_after)}
    return ApiError(answer.status, answer.code, answer.message, field=field if field and answer.field else answer.field,
                    headers=headers)


def rate_limited(wait: float) -> ApiError:
    """A sender over the rate limit: 429 and when to retry (``RateLimiter.allow``'s wait)."""
    return ApiError(429, "rate_limited", "too many messages; retry after the given seconds",
                    headers={"Retry-After": str(max(1, round(wait + 0.5)))})
