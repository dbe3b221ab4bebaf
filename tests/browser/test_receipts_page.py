"""Receipts, unread counts, edits and deletes as the page shows them (docs/receipts.md),
in Debian's Chromium: what a user sees, waited for with Playwright's `expect`."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from tests.browser.helpers import badge, bodies, conversation, open_chat, post, send, ticks
from tests.e2e.helpers import mysql_rows
from tests.timing import eventually_sync


def test_ticks_go_sent_then_delivered_then_read(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(web, alice), open_page(web, bob)
    expect(a.locator("#status")).to_have_text("live")
    expect(b.locator("#status")).to_have_text("live")
    device = b.evaluate("localStorage.getItem('chat.device')")
    assert f"device={device}" in b.evaluate("window.chatApp.client.ws.url")  # what its acks count for
    open_chat(a, bob)

    b.context.set_offline(True)  # bob's only device is away: stored is all that can be said
    expect(b.locator("#status")).to_have_text("offline")
    send(a, "are you there?")
    expect(ticks(a)).to_have_text(["sent"])
    expect(bodies(b)).to_have_count(0)

    b.context.set_offline(False)  # it comes back, gets the message and acknowledges it
    expect(ticks(a)).to_have_text(["delivered"])
    expect(badge(b, alice)).to_have_text("1")
    expect(b.locator("#unread-total")).to_have_text("1 unread")
    expect(ticks(a), "not read while bob has not opened it").to_have_text(["delivered"])

    conversation(b, alice).click()  # bob reads it
    expect(bodies(b)).to_have_text(["are you there?"])
    expect(ticks(a)).to_have_text(["read"])
    expect(badge(b, alice)).to_have_count(0)
    expect(b.locator("#unread-total")).to_be_hidden()

    send(a, "good")  # bob has it on screen: read at once
    expect(ticks(a)).to_have_text(["read", "read"])
    send(b, "yes")
    expect(ticks(b)).to_have_text(["read"])

    a.reload()  # the ticks of a conversation come from GET /v1/conversations
    conversation(a, bob).click()
    expect(bodies(a)).to_have_text(["are you there?", "good", "yes"])
    expect(ticks(a)).to_have_text(["read", "read"])


def test_an_edit_and_a_delete_show_on_both_sides(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(web, alice), open_page(web, bob)
    open_chat(a, bob)
    open_chat(b, alice)
    send(a, "frist")
    send(a, "second")
    send(b, "from bob")
    expect(bodies(b)).to_have_text(["frist", "second", "from bob"])
    expect(bodies(a)).to_have_text(["frist", "second", "from bob"])
    # only my stored messages have the buttons
    expect(a.locator("#messages li.mine button.edit")).to_have_count(2)
    expect(a.locator("#messages li:not(.mine) button")).to_have_count(0)

    first = a.locator("#messages li.mine").nth(0)
    first.locator("button.edit").click()
    first.locator("input.edit-body").fill("first")
    first.locator("input.edit-body").press("Enter")
    expect(bodies(b)).to_have_text(["first", "second", "from bob"])
    expect(b.locator("#messages li").nth(0).locator(".edited")).to_have_text("edited")
    expect(bodies(a)).to_have_text(["first", "second", "from bob"])
    expect(first.locator(".edited")).to_have_text("edited")

    a.locator("#messages li.mine").nth(1).locator("button.delete").click()
    expect(bodies(b)).to_have_text(["first", "message deleted", "from bob"])
    expect(bodies(a)).to_have_text(["first", "message deleted", "from bob"])
    expect(a.locator("#messages li.deleted button")).to_have_count(0)  # a tombstone stays one
    assert b.locator("#messages li.deleted").evaluate("li => li.textContent") == "message deleted"  # no body

    # markup in an edit is text too
    dialogs = []
    b.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    first.locator("button.edit").click()
    first.locator("input.edit-body").fill("<img src=x onerror=alert(1)>")
    first.locator("button[type=submit]").click()
    expect(bodies(b)).to_have_text(["<img src=x onerror=alert(1)>", "message deleted", "from bob"])
    assert b.locator("#messages img").count() == 0 and dialogs == []

    b.reload()  # history gives each message's latest version
    conversation(b, alice).click()
    expect(bodies(b)).to_have_text(["<img src=x onerror=alert(1)>", "message deleted", "from bob"])
    expect(b.locator("#messages li .edited")).to_have_text(["edited"])
    rows = mysql_rows(web, "sender = :s AND recipient = :r AND kind = 0", s=alice, r=bob)
    assert [(r.body, bool(r.deleted)) for r in rows] == [("<img src=x onerror=alert(1)>", False), ("", True)]


def test_reading_on_one_device_clears_the_badge_on_the_other(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    post(web, alice, bob, "one")
    post(web, alice, bob, "two")
    phone, laptop = open_page(web, bob), open_page(web, bob)  # two contexts: two devices of bob
    devices = [page.evaluate("localStorage.getItem('chat.device')") for page in (phone, laptop)]
    assert devices[0] != devices[1]
    for page in (phone, laptop):
        expect(badge(page, alice), "GET /v1/conversations' unread").to_have_text("2")
        expect(page.locator("#status")).to_have_text("live")
    post(web, alice, bob, "three")  # live, on both: one more
    for page in (phone, laptop):
        expect(badge(page, alice)).to_have_text("3")
        expect(page.locator("#unread-total")).to_have_text("3 unread")

    conversation(phone, alice).click()  # read on the phone...
    expect(bodies(phone)).to_have_text(["one", "two", "three"])
    expect(badge(phone, alice)).to_have_count(0)
    expect(badge(laptop, alice), "...cleared on the laptop by the read event").to_have_count(0)
    expect(laptop.locator("#unread-total")).to_be_hidden()

    post(web, alice, bob, "four")  # the phone has it on screen: read there, so never unread
    expect(bodies(phone)).to_have_text(["one", "two", "three", "four"])
    eventually_sync(lambda: unread(web, bob, alice) == 0, "the phone's read marker covers four")
    expect(badge(laptop, alice)).to_have_count(0)
    laptop.reload()  # and the API agrees
    expect(conversation(laptop, alice)).to_be_visible()  # the list is drawn with its counts
    expect(badge(laptop, alice)).to_have_count(0)


def unread(system, user: str, peer: str) -> int:
    reply = httpx.get(f"{system.api_url}/v1/conversations", headers={"Authorization": f"Bearer {system.token(user)}"})
    assert reply.status_code == 200, reply.text
    return next(c["unread"] for c in reply.json()["conversations"] if c["with"] == peer)
