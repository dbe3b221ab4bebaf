"""The Matrix Push Gateway API's client side: ``POST {gateway}/_matrix/push/v1/notify``
(https://spec.matrix.org/v1.11/push-gateway-api/). Sygnal, the reference
gateway, or any compatible one, reaches APNs, FCM and Web Push from there.

aiohttp, not httpx: a request cost the pusher about 1 ms of CPU with httpx,
most of a notification's, and the pusher shares the host's cores with delivery."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
import orjson

from pusher.core import rejected_pushkeys

NOTIFY_PATH = "/_matrix/push/v1/notify"
TIMEOUT_SECONDS = 10.0  # a gateway slower than this is treated as failing: the notification is retried


@dataclass(frozen=True, slots=True)
class GatewayAnswer:
    """What became of one notification sent to the gateway."""

    accepted: bool  # the gateway took it (200): it is not sent again
    rejected: list[str]  # pushkeys the gateway says to stop using
    detail: str  # for the log: the status, or the error


class Gateway:
    def __init__(self, base_url: str, timeout: float = TIMEOUT_SECONDS):
        self._url = base_url.rstrip("/") + NOTIFY_PATH
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def notify(self, request: dict, key: str) -> GatewayAnswer:
        """One notification. ``key`` goes as ``Idempotency-Key``: a notification sent
        again after a restart (its answer was lost) carries the same one."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            headers = {"Content-Type": "application/json", "Idempotency-Key": key}
            async with self._session.post(self._url, data=orjson.dumps(request), headers=headers) as reply:
                if reply.status != 200:
                    return GatewayAnswer(False, [], f"status_{reply.status}")
                try:
                    body = orjson.loads(await reply.read())
                except orjson.JSONDecodeError:
                    body = None
                return GatewayAnswer(True, rejected_pushkeys(body), "200")
        except (TimeoutError, aiohttp.ClientError) as exc:
            return GatewayAnswer(False, [], exc.__class__.__name__)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
