"""The reference web client in a real browser (Debian's Chromium, Playwright)."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from tests.browser.helpers import bodies, open_chat, send
from tests.e2e.helpers import mysql_rows


def test_two_users_exchange_messages(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(web, alice), open_page(web, bob)
    expect(a.locator("#status")).to_have_text("live")
    expect(b.locator("#status")).to_have_text("live")
    open_chat(a, bob)
    open_chat(b, alice)

    send(a, "hello bob")
    expect(bodies(b)).to_have_text(["hello bob"])
    expect(a.locator("#messages li.mine .state")).to_have_text(["delivered"])
    send(b, "hi alice 👋")
    expect(bodies(a)).to_have_text(["hello bob", "hi alice 👋"])
    expect(bodies(b)).to_have_text(["hello bob", "hi alice 👋"])

    rows = mysql_rows(web, "sender = :s AND recipient = :r", s=alice, r=bob)
    assert [(r.body, len(r.client_msg_id)) for r in rows] == [("hello bob", 36)]  # crypto.randomUUID()
    # the conversation list, newest first, came from GET /v1/conversations
    expect(a.locator("#conversations .peer")).to_have_text([bob])
    expect(a.locator("#conversations .preview")).to_have_text(["hi alice 👋"])
    a.reload()
    expect(a.locator("#conversations .preview")).to_have_text(["hi alice 👋"])
