"""Browser fixtures: Debian's Chromium driven by Playwright, against a system whose
API serves the page (api/static/) with dev login on and its own origin allowed.

Playwright's own browser download cannot run here: the system Chromium is used.
Each test saves screenshots in test-artifacts/ (git-ignored)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from harness.servers import ROOT, free_port
from harness.system import Databases, System, running_system
from tests.timing import PATIENCE

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts"

expect.set_options(timeout=PATIENCE * 1000)  # ms


@contextlib.contextmanager
def web_system(dbs: Databases, daemons: int = 1, **env) -> Iterator[System]:
    """API + daemons + the writer on the shared databases, serving the page at
    http://127.0.0.1:<port>/app/, with dev login on and that origin allowed by the daemons.
    The writer process, as deployed: the daemons send the page's acks and read markers to it."""
    port = free_port()
    # URL tokens refused, as by default: the page's client sends none.
    with running_system(dbs, daemons=daemons, apis=1, api_port=port, writer=True,
                        CHAT_DEV_MODE="true", CHAT_DEV_LOGIN="true",
                        CHAT_URL_TOKENS_ALLOWED="false",
                        CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_ALLOWED_ORIGINS=json.dumps([f"http://127.0.0.1:{port}"]), **env) as system:
        yield system


@pytest.fixture(scope="session")
def web(dbs) -> Iterator[System]:
    """The shared web system: one API (dev login on), one daemon, one writer."""
    with web_system(dbs) as system:
        yield system


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Module scope, not session: Playwright's sync API marks an asyncio loop as running
    # in this thread while it is open, and the async e2e tests that run later need none.
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def open_page(browser, request):
    """``open_page(system, user, query="")``: a fresh context (its own sessionStorage),
    logged in with dev login as ``user``. Screenshots every page when the test ends."""
    contexts, pages = [], []

    def open_(system: System, user: str, query: str = "") -> Page:
        context = browser.new_context(viewport={"width": 900, "height": 600})
        contexts.append(context)
        page = context.new_page()
        pages.append((user, page))
        page.goto(f"{system.api_url}/app/{query}")
        page.fill("#dev-user", user)
        page.click("#dev-login button")
        expect(page.locator("#me")).to_have_text(user)
        return page

    yield open_
    ARTIFACTS.mkdir(exist_ok=True)
    for i, (user, page) in enumerate(pages):
        with contextlib.suppress(Exception):
            page.screenshot(path=ARTIFACTS / f"{request.node.name}-{i}-{user.split('-')[0]}.png")
    for context in contexts:
        with contextlib.suppress(Exception):
            context.close()

