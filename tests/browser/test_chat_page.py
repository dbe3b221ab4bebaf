"""The reference web client in a real browser (Debian's Chromium, Playwright)."""

from __future__ import annotations

import re
import threading
import time
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson
from playwright.sync_api import expect

from tests.browser.conftest import ARTIFACTS, web_system
from tests.browser.helpers import bodies, open_chat, post, send, ticks, until, witness
from tests.e2e.helpers import mysql_rows
from tests.timing import PATIENCE, eventually_sync

# A send: POST /v1/messages, its first attempt with the user's ?partition= (the proxy's route), its
# retries without. A history read is the same path with ?with=.
SENDS = re.compile(r".*/v1/messages(\?partition=\d+)?$")


def test_two_users_exchange_messages(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(web, alice), open_page(web, bob)
    expect(a.locator("#status")).to_have_text("live")
    expect(b.locator("#status")).to_have_text("live")
    open_chat(a, bob)
    open_chat(b, alice)

    send(a, "hello bob")
    expect(bodies(b)).to_have_text(["hello bob"])
    expect(ticks(a), "bob has the conversation open").to_have_text(["read"])
    send(b, "hi alice 👋")
    expect(bodies(a)).to_have_text(["hello bob", "hi alice 👋"])
    expect(bodies(b)).to_have_text(["hello bob", "hi alice 👋"])

    rows = mysql_rows(web, "sender = :s AND recipient = :r AND kind = 0", s=alice, r=bob)
    assert [(r.body, len(r.client_msg_id)) for r in rows] == [("hello bob", 36)]  # crypto.randomUUID()
    # the conversation list, newest first, came from GET /v1/conversations
    expect(a.locator("#conversations .peer")).to_have_text([bob])
    expect(a.locator("#conversations .preview")).to_have_text(["hi alice 👋"])
    a.reload()  # the session survives a reload; history comes from GET /v1/messages
    a.click(f"#conversations li[data-peer='{bob}']")
    expect(bodies(a)).to_have_text(["hello bob", "hi alice 👋"])
    expect(ticks(a), "from GET /v1/conversations' peer_read_upto").to_have_text(["read"])


def test_offline_then_online_shows_everything_once_in_order(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(web, alice), open_page(web, bob)
    open_chat(a, bob)
    open_chat(b, alice)
    expect(b.locator("#status")).to_have_text("live")
    send(a, "before")
    expect(bodies(b)).to_have_text(["before"])
    expect(ticks(a)).to_have_text(["read"])  # bob's page has it on screen, and said so

    # Chromium's offline emulation leaves an open WebSocket open (it only holds its
    # frames back); the client's `offline` handler closes it and stops retrying.
    b.context.set_offline(True)
    expect(b.locator("#status")).to_have_text("offline")
    assert b.evaluate("window.chatApp.client.ws") is None
    send(b, "typed offline")
    expect(ticks(b)).to_have_text(["retrying…"])

    with witness(web, bob) as frames:
        for i in range(1, 5):
            send(a, f"while offline {i}")
        # stored, and no device of bob's has them (the witness acknowledges nothing); bob's
        # other connection got all four:
        expect(ticks(a)).to_have_text(["read"] + ["sent"] * 4)
        eventually_sync(lambda: len(frames) >= 4, "bob's other connection got the four messages")
    # ...so the daemon has sent them, and the offline page still shows none of them.
    expect(bodies(b)).to_have_text(["before", "typed offline"])
    assert b.evaluate("window.chatApp.client.status") == "offline"

    b.context.set_offline(False)
    expected = ["before"] + [f"while offline {i}" for i in range(1, 5)] + ["typed offline"]
    expect(b.locator("#status")).to_have_text("live")
    expect(bodies(b)).to_have_text(expected)
    expect(bodies(a)).to_have_text(expected)
    expect(ticks(b)).to_have_text(["read"])
    expect(ticks(a), "bob's page, back, received and read them").to_have_text(["read"] * 5)
    # the retried send was stored exactly once
    assert [r.body for r in mysql_rows(web, "sender = :s AND kind = 0", s=bob)] == ["typed offline"]


def test_daemon_restart_mid_conversation_loses_nothing(dbs, open_page, users):
    alice, bob = users("alice"), users("bob")
    with web_system(dbs, daemons=1, CHAT_DRAIN_SECONDS="0.5") as system:
        a, b = open_page(system, alice), open_page(system, bob)
        open_chat(a, bob)
        open_chat(b, alice)
        expect(b.locator("#status")).to_have_text("live")
        sent: list[str] = []

        def sender():
            for i in range(20):
                sent.append(post(system, alice, bob, f"m{i:02d}")["body"])
                time.sleep(0.05)  # pacing: the restart lands mid-stream

        thread = threading.Thread(target=sender)
        thread.start()
        eventually_sync(lambda: len(sent) >= 8, "eight messages posted")
        system.stop("daemon_0")  # SIGTERM: clients get 1012
        expect(b.locator("#status")).not_to_have_text("live")
        system.start("daemon_0")
        thread.join(PATIENCE)
        expected = [f"m{i:02d}" for i in range(20)]
        assert sent == expected
        expect(bodies(b), "every message once, in order").to_have_text(expected)
        expect(bodies(a)).to_have_text(expected)
        send(b, "still here")  # and the page works on after it
        expect(bodies(a)).to_have_text([*expected, "still here"])


def test_after_a_1012_the_page_asks_its_partition_again_and_follows_where_it_is_served(dbs, open_page, users):
    """A daemon closes with 1012 when it restarts or when the user's slot moves: the page asks
    client-config for its partition before reconnecting. Here the answer is made up (partition 1,
    which this one-partition system has not got), as from an API whose map is not the daemons':
    the daemon refuses that route and names partition 0, the page asks again, gets the same
    answer, and follows the daemon's. Nothing posted meanwhile is lost."""
    alice, bob = users("alice"), users("bob")
    with web_system(dbs, daemons=1, CHAT_DRAIN_SECONDS="0.5") as system:
        a, b = open_page(system, alice), open_page(system, bob)
        open_chat(a, bob)
        open_chat(b, alice)
        expect(b.locator("#status")).to_have_text("live")
        sockets: list[str] = []  # the WebSockets that reached a daemon
        b.on("websocket", lambda ws: sockets.append(ws.url))
        polls: list[str] = []  # and the polls (while the daemon was away the page may fall back to them)
        b.on("request", lambda request: polls.append(request.url) if "/v1/poll" in request.url else None)
        asked: list[str] = []

        def config(route):
            if not route.request.headers.get("authorization"):
                return route.continue_()
            asked.append(route.request.url)
            answer = {"ws_url": f"{system.ws_url}/v1/ws", "poll_url": f"{system.poll_url}", "dev_login": True,
                      "partition": 1}
            return route.fulfill(status=200, content_type="application/json", body=orjson.dumps(answer))

        b.route("**/v1/client-config*", config)
        send(a, "before")
        expect(bodies(b)).to_have_text(["before"])
        system.stop("daemon_0")  # SIGTERM: clients get 1012
        expect(b.locator("#status")).not_to_have_text("live")
        post(system, alice, bob, "while away")
        system.start("daemon_0")
        expect(b.locator("#status")).to_have_text("live")
        expect(bodies(b), "every message once, in order").to_have_text(["before", "while away"])
        def route(url: str) -> list[str] | None:
            return parse_qs(urlsplit(url).query).get("partition")

        assert ["1"] in [route(url) for url in sockets + polls], (sockets, polls)  # where client-config said, first
        assert route(sockets[-1]) == ["0"], sockets  # then where the daemon said
        assert len(asked) >= 2  # after the 1012, and after the daemon's refusal
        send(b, "still here")
        expect(bodies(a)).to_have_text(["before", "while away", "still here"])


def test_markup_in_a_message_is_shown_as_text(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(web, alice), open_page(web, bob)
    dialogs = []
    for page in (a, b):
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    open_chat(a, bob)
    open_chat(b, alice)
    attack = ["<img src=x onerror=alert(1)>", "<script>alert(2)</script>", "<b>bold</b> & &amp;"]
    for text in attack:
        send(a, text)
    expect(bodies(b)).to_have_text(attack)
    expect(b.locator("#conversations .preview")).to_have_text([attack[-1]])
    assert b.locator("#messages li .body").evaluate_all("els => els.map(e => e.textContent)") == attack
    for page in (a, b):
        assert page.locator("img, #messages script, #messages b").count() == 0
    assert dialogs == []


def test_long_poll_transport_delivers_when_asked(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a, b = open_page(web, alice), open_page(web, bob, "?transport=poll")
    expect(b.locator("#status")).to_have_text("polling")
    open_chat(a, bob)
    open_chat(b, alice)
    send(a, "through the long poll")
    expect(bodies(b)).to_have_text(["through the long poll"])
    send(b, "and back")
    expect(bodies(a)).to_have_text(["through the long poll", "and back"])
    expect(ticks(b)).to_have_text(["read"])
    # the polling page acknowledges and reads over HTTP (POST /v1/acks, /v1/read)
    expect(ticks(a)).to_have_text(["read"])
    assert b.evaluate("[window.chatApp.client.transport, window.chatApp.client.ws]") == ["poll", None]
    polls = b.evaluate("performance.getEntriesByType('resource').map(e => e.name)"
                       ".filter(n => n.includes('/v1/poll'))")
    assert polls and all(n.startswith(web.poll_url) for n in polls)  # cross-origin, to the daemon port


def test_dev_login_refusals_and_pasting_a_token(web, browser, users):
    reply = httpx.post(f"{web.api_url}/v1/dev/token", json={"user": "not a user!"})
    assert reply.status_code == 422 and reply.json()["field"] == "user"
    reply = httpx.post(f"{web.api_url}/v1/dev/token", json={"user": "x", "admin": True})
    assert reply.status_code == 422 and reply.json()["field"] == "admin"
    carol = users("carol")
    token = httpx.post(f"{web.api_url}/v1/dev/token", json={"user": carol}).json()["token"]
    assert httpx.get(f"{web.api_url}/v1/conversations",
                     headers={"Authorization": f"Bearer {token}"}).status_code == 200

    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{web.api_url}/")  # redirects to /app/
        page.fill("#token", "not-a-token")
        page.click("#token-login button")
        expect(page.locator("#login-error")).to_have_text("that is not a JWT")
        page.fill("#token", web.token(carol))  # as `chatctl token` makes it
        page.click("#token-login button")
        expect(page.locator("#me")).to_have_text(carol)
        expect(page.locator("#status")).to_have_text("live")
        page.screenshot(path=ARTIFACTS / "test_token_login-carol.png")
    finally:
        context.close()


def test_a_message_typed_before_a_reload_is_sent_after_it_exactly_once(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a = open_page(web, alice)
    open_chat(a, bob)
    expect(a.locator("#status")).to_have_text("live")
    posts = []

    def api_down(route):  # this page's POSTs never reach the API
        posts.append(route.request.post_data_json)
        route.abort("connectionrefused")

    a.route(SENDS, api_down)
    send(a, "typed before the reload")
    expect(ticks(a)).to_have_text(["retrying…"])
    outbox = "Object.keys(localStorage).filter(k => k.startsWith('chat.outbox.'))"
    assert len(a.evaluate(outbox)) == 1
    tried = len(posts)

    a.reload()  # the API is still down: the page comes back and sends what was unsent
    expect(a.locator("#me")).to_have_text(alice)
    until(a, lambda: len(posts) > tried, "a POST after the reload")
    open_chat(a, bob)
    expect(bodies(a)).to_have_text(["typed before the reload"])
    expect(ticks(a)).to_have_text(["retrying…"])
    assert {p["client_msg_id"] for p in posts} == {posts[0]["client_msg_id"]}  # one id, every attempt

    a.unroute(SENDS)  # the API answers again
    expect(ticks(a)).to_have_text(["sent"])
    assert a.evaluate(outbox) == []
    rows = mysql_rows(web, "sender = :s AND kind = 0", s=alice)
    assert [(r.body, r.client_msg_id) for r in rows] == [("typed before the reload", posts[0]["client_msg_id"])]
    b = open_page(web, bob)
    b.click(f"#conversations li[data-peer='{alice}']")
    expect(bodies(b)).to_have_text(["typed before the reload"])


def test_logging_out_drops_what_is_unsent(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    a = open_page(web, alice)
    open_chat(a, bob)
    a.route(SENDS, lambda route: route.abort("connectionrefused"))
    send(a, "never sent")
    expect(ticks(a)).to_have_text(["retrying…"])
    a.click("#logout")
    expect(a.locator("#dev-login")).to_be_visible()
    assert a.evaluate("Object.keys(localStorage).filter(k => k.startsWith('chat.outbox.'))") == []
    a.unroute(SENDS)
    posted = []
    a.on("request", lambda r: posted.append(r.post_data_json["body"])
         if r.method == "POST" and SENDS.fullmatch(r.url) else None)
    a.fill("#dev-user", alice)
    a.click("#dev-login button")
    expect(a.locator("#status")).to_have_text("live")
    # A barrier: a resend of what was dropped would go as the client starts, before
    # anything typed after the login; once that is stored, nothing else was sent.
    open_chat(a, bob)
    send(a, "typed after logging in again")
    expect(ticks(a)).to_have_text(["sent"])
    assert posted == ["typed after logging in again"]
    assert [r.body for r in mysql_rows(web, "sender = :s AND kind = 0", s=alice)] == ["typed after logging in again"]


def test_older_history_comes_a_page_at_a_time(web, open_page, users):
    alice, bob = users("alice"), users("bob")
    with httpx.Client() as client:
        sent = [post(web, alice, bob, f"m{i:02d}", client)["body"] for i in range(55)]
    b = open_page(web, bob)
    b.click(f"#conversations li[data-peer='{alice}']")
    expect(bodies(b)).to_have_text(sent[5:])  # the newest page: 50
    expect(b.locator("#older")).to_be_visible()
    b.click("#older")
    expect(bodies(b)).to_have_text(sent)
    expect(b.locator("#older")).to_be_hidden()  # the conversation's start
    post(web, alice, bob, "live after paging")
    expect(bodies(b)).to_have_text([*sent, "live after paging"])


def test_no_conversation_opens_before_the_client_exists(web, browser, users):
    # Opening a conversation reads the client's outbox. Held in the gap while the
    # client asks which partition it is in, a click used to throw there and leave
    # the conversation empty for good: now the list shows only once the client exists.
    alice, bob = users("alice"), users("bob")
    post(web, alice, bob, "history before the start")
    held = []
    context = browser.new_context()
    page = context.new_page()
    try:
        page.route("**/v1/client-config*", lambda route: held.append(route) if route.request.headers.get(
            "authorization") else route.continue_())  # the page's config passes; the partition question waits
        page.goto(f"{web.api_url}/app/")
        page.fill("#dev-user", bob)
        page.click("#dev-login button")
        until(page, lambda: held, "the client asked for its partition")
        assert not page.locator(f"#conversations li[data-peer='{alice}']").is_visible()
        held[0].continue_()
        page.click(f"#conversations li[data-peer='{alice}']")
        expect(bodies(page)).to_have_text(["history before the start"])
    finally:
        context.close()
