"""Toxiproxy's HTTP API (v2.9): the request bodies (pure) and a small client.

One proxy per (host, database) lets a host's link to MySQL or to Mongo get
latency or be cut alone. The API is plain JSON over HTTP on :8474.
"""

from __future__ import annotations

import httpx

from cluster.plan import Proxy

LATENCY_TOXIC = "rtt"


def populate_body(proxies: list[Proxy]) -> list[dict]:
    """POST /populate: creates (or updates) every proxy, enabled."""
    return [{"name": p.name, "listen": p.listen, "upstream": p.upstream, "enabled": True} for p in proxies]


def latency_body(rtt_ms: float) -> dict:
    """POST /proxies/<name>/toxics: ``rtt_ms`` added to every answer (downstream), so each
    request/answer round trip between the host and the database takes that much longer."""
    if not 0 <= rtt_ms <= 10_000:
        raise ValueError(f"rtt_ms must be 0..10000, not {rtt_ms}")
    return {"name": LATENCY_TOXIC, "type": "latency", "stream": "downstream", "toxicity": 1.0,
            "attributes": {"latency": int(round(rtt_ms)), "jitter": 0}}


def enabled_body(enabled: bool) -> dict:
    """POST /proxies/<name>: disabled, the proxy closes its connections and refuses new ones (the link is cut)."""
    return {"enabled": enabled}


class Toxiproxy:
    def __init__(self, api: str, timeout: float = 5.0):
        self._http = httpx.Client(base_url=api, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def _check(self, r: httpx.Response) -> httpx.Response:
        if r.status_code >= 400:
            raise RuntimeError(f"toxiproxy {r.request.method} {r.request.url.path}: {r.status_code} {r.text}")
        return r

    def version(self) -> str:
        return self._check(self._http.get("/version")).text.strip()

    def populate(self, proxies: list[Proxy]) -> None:
        self._check(self._http.post("/populate", json=populate_body(proxies)))

    def set_latency(self, proxy: str, rtt_ms: float) -> None:
        self._http.delete(f"/proxies/{proxy}/toxics/{LATENCY_TOXIC}")  # 404 when there is none: fine
        if rtt_ms > 0:
            self._check(self._http.post(f"/proxies/{proxy}/toxics", json=latency_body(rtt_ms)))

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        self._check(self._http.post(f"/proxies/{proxy}", json=enabled_body(enabled)))
