"""What a person does on the chat page, as Playwright calls."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import orjson
from playwright.sync_api import Locator, Page, expect
from websockets.sync.client import connect

from harness.system import System
from tests.timing import PATIENCE, POLL_SECONDS, S


def open_chat(page: Page, peer: str) -> None:
    page.fill("#peer", peer)
    page.click("#open-chat button")
    expect(page.locator("#title")).to_have_text(peer)


def send(page: Page, body: str) -> None:
    page.fill("#body", body)
    page.press("#body", "Enter")


def bodies(page: Page) -> Locator:
    return page.locator("#messages li .body")


def ticks(page: Page) -> Locator:
    """The state of each of my messages in the open conversation: sending…, sent, delivered, read."""
    return page.locator("#messages li.mine .state")


def badge(page: Page, peer: str) -> Locator:
    """The unread count of the conversation with ``peer`` in the list (none when all is read)."""
    return page.locator(f"#conversations li[data-peer='{peer}'] .badge")


def conversation(page: Page, peer: str) -> Locator:
    return page.locator(f"#conversations li[data-peer='{peer}']")


@contextlib.contextmanager
def witness(system: System, user: str) -> Iterator[list[dict]]:
    """Another connection of ``user`` (no browser): the message frames it receives."""
    frames: list[dict] = []
    with connect(f"{system.ws_url}/v1/ws", additional_headers={"Authorization": f"Bearer {system.token(user)}"}) as ws:
        assert orjson.loads(ws.recv(PATIENCE))["type"] == "hello"

        def read():
            with contextlib.suppress(Exception):
                for raw in ws:
                    frames.append(orjson.loads(raw))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        yield frames
    reader.join(PATIENCE)


def until(page: Page, condition: Callable[[], object], what: str, timeout: float = PATIENCE) -> None:
    """Until ``condition()`` holds for something the page's handlers record (routes,
    events): Playwright runs them only while one of its calls waits, so the poll
    waits in the page (`tests.timing.eventually_sync` would keep them from running)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never happened within {timeout:.0f} s: {what}")
        page.wait_for_timeout(POLL_SECONDS * 1000)  # pacing of the poll


def post(system: System, sender: str, to: str, body: str, client: httpx.Client | None = None) -> dict:
    reply = (client or httpx).post(f"{system.api_url}/v1/messages", json={"to": to, "body": body},
                                   headers={"Authorization": f"Bearer {system.token(sender)}"}, timeout=10 * S)
    assert reply.status_code == 201, reply.text
    return reply.json()
