"""The write API's error answers: ``chat.errors.Refused`` as a Starlette response."""

from __future__ import annotations

from starlette.responses import Response

from chat.errors import Refused


class ApiError(Refused):
    def response(self) -> Response:
        return Response(self.body(), self.status, self.headers, media_type="application/json")
