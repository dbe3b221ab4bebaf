"""Typing and presence as the page shows them (docs/presence.md), in two windows of Debian's
Chromium: what one user does, what the other sees, waited for with Playwright's `expect`.

The system's typing indicators last a second (CHAT_TYPING_TTL_SECONDS=1) and a user turns
offline as soon as their last connection closes (CHAT_PRESENCE_GRACE_SECONDS=0), so that what
ends by itself ends soon; each test waits for it to happen, never for a time to pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from harness.system import System
from tests.browser.conftest import web_system
from tests.browser.helpers import bodies, conversation, open_chat, post

TTL_SECONDS = 1

# Installed in a page before the other side types: whether "typing…" was ever shown, kept
# even after it ended by itself, so that a test can wait for both without racing the ttl.
WATCH_TYPING = """() => {
  window.typingShown = 0;
  const typing = document.getElementById("typing");
  new MutationObserver(() => { if (!typing.hidden) window.typingShown += 1; })
    .observe(typing, { attributes: true, attributeFilter: ["hidden"] });
}"""


@pytest.fixture(scope="module")
def signals_web(dbs) -> Iterator[System]:
    with web_system(dbs, CHAT_TYPING_TTL_SECONDS=str(TTL_SECONDS), CHAT_PRESENCE_GRACE_SECONDS="0") as system:
        yield system


def typing_shown(page: Page, times: int = 1) -> None:
    """Until "typing…" has been shown ``times`` times since WATCH_TYPING was installed."""
    page.wait_for_function(f"window.typingShown >= {times}")


def test_typing_shows_in_the_peers_window_and_ends_by_itself_or_with_the_message(signals_web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(signals_web, alice), open_page(signals_web, bob)
    open_chat(a, bob)
    open_chat(b, alice)
    for page in (a, b):
        expect(page.locator("#status")).to_have_text("live")
    expect(b.locator("#typing")).to_be_hidden()
    b.evaluate(WATCH_TYPING)

    a.locator("#body").press_sequentially("hel")  # one start: the page sends one per 2 s at most
    typing_shown(b)
    expect(b.locator("#typing")).to_have_text("typing…")
    # Alice types nothing more: no refresh, so it ends after its ttl.
    expect(b.locator("#typing")).to_be_hidden()
    expect(a.locator("#typing"), "her own typing shows nowhere on her side").to_be_hidden()

    a.fill("#body", "")  # cleared: a stop, and the next key starts again at once
    a.locator("#body").press_sequentially("hello")
    typing_shown(b, 2)
    a.press("#body", "Enter")  # the message, and a stop: the indicator ends with them
    expect(bodies(b)).to_have_text(["hello"])
    expect(b.locator("#typing")).to_be_hidden()


def test_the_peer_shows_online_then_last_seen_once_their_page_closes(signals_web, open_page, users):
    alice, bob = users("alice"), users("bob")
    post(signals_web, alice, bob, "hi")  # alice is in bob's conversation list
    a = open_page(signals_web, alice)
    expect(a.locator("#status")).to_have_text("live")
    b = open_page(signals_web, bob)
    mark = conversation(b, alice).locator(".presence")
    expect(mark, "the list watches its peers").to_have_attribute("data-state", "online")
    open_chat(b, alice)
    expect(b.locator("#presence")).to_have_text("online")
    expect(b.locator("#presence")).to_have_attribute("data-state", "online")

    a.close()  # her only connection ends: with no grace, she is offline at once
    expect(b.locator("#presence")).to_have_text("last seen just now")
    expect(b.locator("#presence")).to_have_attribute("data-state", "offline")
    expect(mark).to_have_text("last seen just now")

    a = open_page(signals_web, alice)  # back
    expect(b.locator("#presence")).to_have_text("online")
    expect(mark).to_have_attribute("data-state", "online")


def test_a_peer_opened_by_name_is_watched_too(signals_web, open_page, users):
    alice, carol = users("alice"), users("carol")
    a = open_page(signals_web, alice)
    open_chat(a, carol)  # no conversation yet: not in the list, still watched
    expect(a.locator("#status")).to_have_text("live")
    expect(a.locator("#presence")).to_have_attribute("data-state", "unknown")  # never seen
    c = open_page(signals_web, carol)
    expect(c.locator("#status")).to_have_text("live")
    expect(a.locator("#presence")).to_have_text("online")


def test_a_user_who_hides_their_presence_reads_as_never_seen_and_can_show_it_again(signals_web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a = open_page(signals_web, alice)
    expect(a.locator("#status")).to_have_text("live")
    b = open_page(signals_web, bob)
    open_chat(b, alice)
    expect(b.locator("#presence")).to_have_text("online")

    hide = a.locator("#hide-presence")
    expect(hide).not_to_be_checked()
    hide.check()
    expect(b.locator("#presence"), "hidden: offline, and never seen").to_have_attribute("data-state", "unknown")
    expect(b.locator("#presence")).to_have_text("")
    a.reload()  # the choice is stored: the page reads it back
    expect(a.locator("#hide-presence")).to_be_checked()
    a.locator("#hide-presence").uncheck()
    expect(b.locator("#presence")).to_have_text("online")
