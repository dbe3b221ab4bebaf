"""The Matrix Push Gateway API's client side: ``POST {gateway}/_matrix/push/v1/notify``
(https://spec.matrix.org/v1.11/push-gateway-api/). Sygnal, the reference
gateway, or any compatible one, reaches APNs, FCM and Web Push from there."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from pusher.core import rejected_pushkeys

NOTIFY_PATH = "/_matrix/push/v1/notify"
TIMEOUT_SECONDS = 10.0  # a gateway slower than this is treated as failing: the notification is retried


@dataclass(frozen=True, slots=True)
class Answer:
    accepted: bool  # the gateway took it (200): it is not sent again
    rejected: list[str]  # pushkeys the gateway says to stop using
    detail: str  # for the log: the status, or the error


class Gateway:
    def __init__(self, base_url: str, timeout: float = TIMEOUT_SECONDS):
        self._url = base_url.rstrip("/") + NOTIFY_PATH
        self._client = httpx.AsyncClient(timeout=timeout)

    async def notify(self, request: dict, key: str) -> Answer:
        """One notification. ``key`` goes as ``Idempotency-Key``: a notification sent
        again after a restart (its answer was lost) carries the same one."""
        try:
            reply = await self._client.post(self._url, json=request, headers={"Idempotency-Key": key})
        except httpx.HTTPError as exc:
            return Answer(False, [], exc.__class__.__name__)
        if reply.status_code != 200:
            return Answer(False, [], f"status_{reply.status_code}")
        try:
            body = reply.json()
        except ValueError:
            body = None
        return Answer(True, rejected_pushkeys(body), "200")

    async def close(self) -> None:
        await self._client.aclose()
