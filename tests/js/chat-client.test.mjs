// The web client's rules without a browser or a server: fake WebSocket, fetch and window.
// Run: node --test tests/js/   (tests/core/test_web_client_js.py runs it in `make test`)
import assert from "node:assert/strict";
import { test } from "node:test";

import { ChatClient, backoffDelay } from "../../api/static/chat-client.js";

class FakeSocket {
  static all = [];
  constructor(url) { this.url = url; this.closed = false; FakeSocket.all.push(this); }
  close() { if (!this.closed) { this.closed = true; this.onclose?.({ code: 1000 }); } }
  hello(cursor, recovered = false) { this.frame({ type: "hello", cursor, recovered, user: "bob" }); }
  frame(obj) { this.onmessage({ data: JSON.stringify(obj) }); }
  drop() { this.closed = true; this.onclose?.({ code: 1012 }); }
}

const msg = (id, extra = {}) => ({ type: "message", id, from: "alice", to: "bob", body: `m${id}`, ...extra });
const tick = (ms = 15) => new Promise((resolve) => setTimeout(resolve, ms));
const since = (url) => new URL(url).searchParams.get("since");

function makeClient(options = {}) {
  FakeSocket.all = [];
  const win = new EventTarget();
  const client = new ChatClient({
    wsUrl: "ws://d/v1/ws", pollUrl: "http://d/v1/poll", token: "t", user: "bob",
    backoffBaseMs: 1, backoffMaxMs: 2, WebSocketImpl: FakeSocket, eventSource: win, ...options,
  });
  const got = [];
  const statuses = [];
  client.addEventListener("message", (e) => got.push(e.detail.id));
  client.addEventListener("status", (e) => statuses.push(e.detail));
  return { client, win, got, statuses };
}

test("backoff grows, is capped, and is jittered within [cap/2, cap]", () => {
  assert.equal(backoffDelay(1, 100, 1000, () => 0), 50);
  assert.equal(backoffDelay(3, 100, 1000, () => 1), 400);
  assert.equal(backoffDelay(30, 100, 1000, () => 1), 1000);
});

test("resumes with the hello cursor, then the last id, and drops repeats", async () => {
  const { client, got, statuses } = makeClient();
  client.start();
  const first = FakeSocket.all[0];
  assert.equal(since(first.url), null);
  first.hello("10");
  assert.equal(client.since, "10");
  first.frame(msg("11"));
  first.frame(msg("12"));
  first.drop(); // 1012: daemon restarting
  await tick();
  const second = FakeSocket.all[1];
  assert.equal(since(second.url), "12");
  second.hello("12", true);
  assert.equal(client.since, "12"); // ours kept while catch-up comes
  second.frame(msg("12")); // a repeat
  second.frame(msg("13"));
  assert.deepEqual(got, ["11", "12", "13"]);
  assert.deepEqual(statuses.slice(0, 3), ["connecting", "live", "reconnecting"]);
  client.stop();
});

test("recovered: false after a since asks the page to reload", () => {
  const { client } = makeClient({ since: "5" });
  let resets = 0;
  client.addEventListener("reset", () => resets++);
  client.start();
  FakeSocket.all[0].hello("900", false);
  assert.equal(resets, 1);
  assert.equal(client.since, "900");
  client.stop();
});

test("falls back to the long poll after N WebSocket failures, as a simple GET", async () => {
  const calls = [];
  const fetchImpl = (url, init) => {
    calls.push({ url, init });
    return new Promise(() => {}); // a poll that waits
  };
  const { client, statuses } = makeClient({ wsFailuresBeforePoll: 3, fetchImpl });
  client.start();
  for (let i = 0; i < 3; i++) {
    await tick();
    FakeSocket.all.at(-1).drop(); // never reached hello
  }
  await tick();
  assert.equal(FakeSocket.all.length, 3);
  assert.equal(calls.length, 1);
  const url = new URL(calls[0].url);
  assert.equal(url.origin + url.pathname, "http://d/v1/poll");
  assert.equal(url.searchParams.get("token"), "t");
  assert.equal(calls[0].init.headers, undefined); // no custom headers: no CORS preflight
  assert.equal(statuses.at(-1), "polling");
  client.stop();
});

test("offline closes the socket and waits; online reconnects at once with since", async () => {
  const { client, win } = makeClient();
  client.start();
  const ws = FakeSocket.all[0];
  ws.hello("7");
  ws.frame(msg("8"));
  win.dispatchEvent(new Event("offline"));
  assert.ok(ws.closed);
  assert.equal(client.status, "offline");
  await tick(30);
  assert.equal(FakeSocket.all.length, 1); // no retries while offline
  win.dispatchEvent(new Event("online"));
  assert.equal(FakeSocket.all.length, 2);
  assert.equal(since(FakeSocket.all[1].url), "8");
  client.stop();
});

test("a send is retried with the same client_msg_id, then stored, then delivered", async () => {
  const bodies = [];
  let failures = 2;
  const fetchImpl = async (url, init) => {
    bodies.push(JSON.parse(init.body));
    if (failures-- > 0) throw new TypeError("network down");
    return { status: 201, ok: true, json: async () => msg("20", { from: "bob", to: "alice", body: "hi",
                                                                   client_msg_id: bodies[0].client_msg_id }) };
  };
  const { client } = makeClient({ fetchImpl });
  const states = [];
  client.addEventListener("outbox", (e) => states.push(e.detail.state));
  client.start();
  FakeSocket.all[0].hello("19");
  const entry = client.send("alice", "hi");
  await entry.done;
  assert.equal(bodies.length, 3);
  assert.equal(new Set(bodies.map((b) => b.client_msg_id)).size, 1);
  FakeSocket.all[0].frame(msg("20", { from: "bob", to: "alice", body: "hi", client_msg_id: entry.clientMsgId }));
  assert.deepEqual(states, ["sending", "retrying", "stored", "delivered"]);
  client.stop();
});

test("a refusal (4xx) fails the send without retrying", async () => {
  let calls = 0;
  const fetchImpl = async () => {
    calls++;
    return { status: 422, ok: false, json: async () => ({ error: "invalid_field", message: "bad", field: "to" }) };
  };
  const { client } = makeClient({ fetchImpl });
  const entry = client.send("not a user", "x");
  await assert.rejects(entry.done, /bad/);
  assert.equal(calls, 1);
});
