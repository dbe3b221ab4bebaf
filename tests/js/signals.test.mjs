// Typing and presence as the page reads them (api/static/signals.js): pure rules on a clock the
// test moves, so nothing waits. Run: node --test tests/js/
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  PresenceBook, TypingIndicators, TypingSender, WATCH_MAX, presenceText, sameUsers, watchList,
} from "../../api/static/signals.js";

function clock(start = 1_000_000) {
  const c = { ms: start, now: () => c.ms, advance: (ms) => { c.ms += ms; } };
  return c;
}

const typing = (from, to, extra = {}) => ({ type: "typing", from, to, state: "start", ttl: 5, ...extra });

test("a start shows for its ttl, a second start refreshes it, then it ends by itself", () => {
  const c = clock();
  const shown = new TypingIndicators(c.now);
  assert.equal(shown.apply(typing("alice", "bob"), "bob"), "alice");
  assert.equal(shown.isTyping("alice"), true);
  assert.equal(shown.nextChangeIn(), 5000);
  c.advance(4000);
  assert.equal(shown.apply(typing("alice", "bob"), "bob"), "alice"); // refreshed: 5 s from now
  c.advance(4999);
  assert.equal(shown.isTyping("alice"), true);
  assert.equal(shown.nextChangeIn(), 1);
  c.advance(1);
  assert.equal(shown.isTyping("alice"), false);
  assert.equal(shown.nextChangeIn(), null); // nothing left to look at
});

test("the ttl is the frame's: a server with CHAT_TYPING_TTL_SECONDS=1 ends it after a second", () => {
  const c = clock();
  const shown = new TypingIndicators(c.now);
  shown.apply(typing("alice", "bob", { ttl: 1 }), "bob");
  c.advance(999);
  assert.equal(shown.isTyping("alice"), true);
  c.advance(1);
  assert.equal(shown.isTyping("alice"), false);
  shown.apply(typing("alice", "bob", { ttl: 0.5 }), "bob"); // fractions of a second too
  assert.equal(shown.nextChangeIn(), 500);
  shown.apply(typing("carol", "bob", { ttl: "7" }), "bob"); // not a number: the default, 5 s
  assert.equal(shown.until.get("carol") - c.now(), 5000);
});

test("a stop, or a message from the peer, ends it at once", () => {
  const c = clock();
  const shown = new TypingIndicators(c.now);
  shown.apply(typing("alice", "bob"), "bob");
  assert.equal(shown.apply(typing("alice", "bob", { state: "stop" }), "bob"), "alice");
  assert.equal(shown.isTyping("alice"), false);
  assert.equal(shown.apply(typing("alice", "bob", { state: "stop" }), "bob"), null); // nothing showed: no change
  shown.apply(typing("alice", "bob"), "bob");
  assert.equal(shown.clear("alice"), true); // her message came
  assert.equal(shown.isTyping("alice"), false);
  assert.equal(shown.clear("alice"), false);
});

test("only typing to me from someone else shows: my own, echoed to my other tabs, does not", () => {
  const shown = new TypingIndicators(clock().now);
  assert.equal(shown.apply(typing("bob", "alice"), "bob"), null); // I type to alice in another tab
  assert.equal(shown.apply(typing("alice", "carol"), "bob"), null); // not to me
  assert.equal(shown.apply({ type: "presence", user: "alice", online: true }, "bob"), null);
  assert.equal(shown.apply(typing("a b", "bob"), "bob"), null); // not a user id
  assert.equal(shown.until.size, 0);
  shown.apply(typing("alice", "bob"), "bob");
  shown.apply(typing("carol", "bob", { ttl: 2 }), "bob");
  assert.equal(shown.isTyping("alice") && shown.isTyping("carol"), true);
  assert.equal(shown.nextChangeIn(), 2000); // the soonest end
});

test("the composer sends a start at most every 2 s while the user types", () => {
  const c = clock();
  const sender = new TypingSender({ now: c.now });
  assert.deepEqual(sender.input("alice", "h"), [{ type: "typing", to: "alice", state: "start" }]);
  c.advance(500);
  assert.deepEqual(sender.input("alice", "he"), []);
  c.advance(1499);
  assert.deepEqual(sender.input("alice", "hel"), []);
  c.advance(1);
  assert.deepEqual(sender.input("alice", "hell"), [{ type: "typing", to: "alice", state: "start" }]);
  c.advance(10_000); // a pause longer than the ttl: the next key starts again at once
  assert.deepEqual(sender.input("alice", "hello"), [{ type: "typing", to: "alice", state: "start" }]);
});

test("a cleared composer, a sent message or another conversation sends a stop, once", () => {
  const c = clock();
  const sender = new TypingSender({ now: c.now });
  sender.input("alice", "hi");
  assert.deepEqual(sender.input("alice", ""), [{ type: "typing", to: "alice", state: "stop" }]);
  assert.deepEqual(sender.input("alice", ""), []); // nothing started: nothing to stop
  assert.deepEqual(sender.input("alice", "again"), [{ type: "typing", to: "alice", state: "start" }]); // at once
  assert.deepEqual(sender.stop(), [{ type: "typing", to: "alice", state: "stop" }]); // sent
  assert.deepEqual(sender.stop(), []);
  sender.input("alice", "x");
  assert.deepEqual(sender.input("carol", "x"), [ // the text stayed, the conversation changed
    { type: "typing", to: "alice", state: "stop" }, { type: "typing", to: "carol", state: "start" }]);
  assert.deepEqual(sender.input(null, "x"), [{ type: "typing", to: "carol", state: "stop" }]); // none open
});

test("the watch list: user ids, each once, in order, at most 200", () => {
  assert.deepEqual(watchList(["bob", "alice", "bob", "a b", null, "", "carol"]), ["bob", "alice", "carol"]);
  const many = Array.from({ length: 250 }, (_, i) => `u${i}`);
  const list = watchList(many);
  assert.equal(WATCH_MAX, 200);
  assert.equal(list.length, 200);
  assert.deepEqual(list.slice(0, 2), ["u0", "u1"]); // the first ones: the newest conversations
  assert.deepEqual(watchList(["x", "y", "z"], 2), ["x", "y"]);
  assert.equal(sameUsers(["a", "b"], ["b", "a"]), true); // moved, not changed
  assert.equal(sameUsers(["a", "b"], ["a", "c"]), false);
  assert.equal(sameUsers(["a"], ["a", "b"]), false);
});

test("a snapshot then changes: who is online, and since when the others are not", () => {
  const book = new PresenceBook();
  assert.deepEqual(book.apply({ type: "presence", users: [
    { user: "alice", online: true, last_seen: null },
    { user: "carol", online: false, last_seen: "2026-11-26T13:01:02.345Z" },
    { user: "dave", online: false, last_seen: null }, // never seen, or hidden
  ] }), ["alice", "carol", "dave"]);
  assert.deepEqual(book.get("alice"), { online: true, last_seen: null });
  assert.deepEqual(book.apply({ type: "presence", user: "alice", online: false, last_seen: "2026-11-26T13:05:00.000Z" }),
                   ["alice"]);
  assert.deepEqual(book.get("alice"), { online: false, last_seen: "2026-11-26T13:05:00.000Z" });
  assert.deepEqual(book.apply({ type: "presence", user: "alice", online: false, last_seen: "2026-11-26T13:05:00.000Z" }),
                   []); // the same again: no change
  assert.deepEqual(book.apply({ type: "presence", user: "alice", online: true, last_seen: "2026-11-26T13:05:00.000Z" }),
                   ["alice"]);
  assert.deepEqual(book.get("alice"), { online: true, last_seen: null }); // online has no last_seen
  assert.deepEqual(book.apply({ type: "presence", user: "a b", online: true }), []);
  assert.deepEqual(book.apply({ type: "presence", user: "erin", online: "yes" }), []);
  assert.equal(book.get("erin"), null);
  book.clear();
  assert.equal(book.get("carol"), null);
});

test("presence reads as online, or last seen so long ago, or nothing when unknown", () => {
  const at = Date.parse("2026-11-26T13:00:00.000Z");
  const seen = (iso) => ({ online: false, last_seen: iso });
  assert.equal(presenceText({ online: true, last_seen: null }, at), "online");
  assert.equal(presenceText(seen("2026-11-26T12:59:30.000Z"), at), "last seen just now");
  assert.equal(presenceText(seen("2026-11-26T13:00:05.000Z"), at), "last seen just now"); // a clock ahead of ours
  assert.equal(presenceText(seen("2026-11-26T12:55:00.000Z"), at), "last seen 5 min ago");
  assert.equal(presenceText(seen("2026-11-26T10:00:00.000Z"), at), "last seen 3 h ago");
  assert.equal(presenceText(seen("2026-11-24T09:00:00.000Z"), at), "last seen 2026-11-24");
  assert.equal(presenceText(seen(null), at), ""); // never seen, or hidden
  assert.equal(presenceText(seen("yesterday"), at), "");
  assert.equal(presenceText(null, at), "");
});
