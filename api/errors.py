"""The one shape of every error answer: ``{"error": code, "message": text, "field": name?}``."""

from __future__ import annotations

import orjson
from starlette.responses import Response


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}

    def body(self) -> bytes:
        body = {"error": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return orjson.dumps(body)

    def response(self) -> Response:
        return Response(self.body(), self.status, self.headers, media_type="application/json")
