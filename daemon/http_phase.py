"""A connection's HTTP/1.1 phase: the requests httptools parses, until the
connection upgrades to a WebSocket (``daemon.connection`` drops it then)."""

from __future__ import annotations

import asyncio
import time
from collections import deque

import httptools


class Request:
    """One parsed request: its line, its headers (names in lower case) and what it asks of the connection."""

    __slots__ = ("method", "target", "headers", "keep_alive", "upgrade", "version")

    def __init__(self, method: str, target: bytes, headers: dict[str, str], keep_alive: bool, upgrade: bool,
                 version: str = "1.1"):
        self.method, self.target, self.headers = method, target, headers
        self.keep_alive, self.upgrade, self.version = keep_alive, upgrade, version



class HttpPhase:
    """What a connection needs only until it upgrades (httptools callbacks)."""

    __slots__ = ("parser", "target", "headers", "head_bytes", "requests", "task", "rest", "idle_since")

    def __init__(self) -> None:
        self.idle_since = time.monotonic()  # no request in hand since then (the idle sweep, daemon.lifecycle)
        self.parser = httptools.HttpRequestParser(self)
        self.target = b""
        self.headers: dict[str, str] = {}
        self.head_bytes = 0
        self.requests: deque[Request] = deque()
        self.task: asyncio.Task | None = None
        self.rest = b""  # bytes after an upgrade request: the client's first frames

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_message_complete(self) -> None:
        p = self.parser
        self.requests.append(Request(p.get_method().decode(), self.target, self.headers,
                                     p.should_keep_alive(), p.should_upgrade(), p.get_http_version()))
        self.target, self.headers, self.head_bytes = b"", {}, 0
