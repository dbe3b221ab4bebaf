"""The reference web client in a real browser (Debian's Chromium, Playwright)."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from tests.browser.helpers import bodies, open_chat, post, send, wait_for, witness
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


def test_offline_then_online_shows_everything_once_in_order(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(web, alice), open_page(web, bob)
    open_chat(a, bob)
    open_chat(b, alice)
    expect(b.locator("#status")).to_have_text("live")
    send(a, "before")
    expect(bodies(b)).to_have_text(["before"])

    # Chromium's offline emulation leaves an open WebSocket open (it only holds its
    # frames back); the client's `offline` handler closes it and stops retrying.
    b.context.set_offline(True)
    expect(b.locator("#status")).to_have_text("offline")
    assert b.evaluate("window.chatApp.client.ws") is None
    send(b, "typed offline")
    expect(b.locator("#messages li.mine .state")).to_have_text(["retrying…"])

    with witness(web, bob) as frames:
        for i in range(1, 5):
            send(a, f"while offline {i}")
        # alice's own stream confirms each one; bob's other connection got all four:
        expect(a.locator("#messages li.mine .state")).to_have_text(["delivered"] * 5)
        wait_for(lambda: len(frames) >= 4)
    # ...so the daemon has sent them, and the offline page still shows none of them.
    expect(bodies(b)).to_have_text(["before", "typed offline"])
    assert b.evaluate("window.chatApp.client.status") == "offline"

    b.context.set_offline(False)
    expected = ["before"] + [f"while offline {i}" for i in range(1, 5)] + ["typed offline"]
    expect(b.locator("#status")).to_have_text("live")
    expect(bodies(b)).to_have_text(expected)
    expect(bodies(a)).to_have_text(expected)
    expect(b.locator("#messages li.mine .state")).to_have_text(["delivered"])
    # the retried send was stored exactly once
    assert [r.body for r in mysql_rows(web, "sender = :s", s=bob)] == ["typed offline"]
