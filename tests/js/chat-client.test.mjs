// The web client's rules without a browser or a server: fake WebSocket, fetch and window.
// Run: node --test tests/js/   (tests/core/test_web_client_js.py runs it in `make test`)
import assert from "node:assert/strict";
import { once } from "node:events";
import { test } from "node:test";

import { ChatClient, backoffDelay, nextRoute } from "../../api/static/chat-client.js";

class FakeSocket {
  static all = [];
  constructor(url) { this.url = url; this.closed = false; this.sent = []; FakeSocket.all.push(this); }
  open() { this.onopen?.(); }
  send(data) { this.sent.push(JSON.parse(data)); }
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
    backoffBaseMs: 1, backoffMaxMs: 2, WebSocketImpl: FakeSocket, eventSource: win, storage: null, ...options,
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

test("falls back to the long poll after N WebSocket failures, the token in Authorization", async () => {
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
  assert.equal(url.searchParams.has("token"), false); // a URL ends up in proxies' logs
  // no timeout: the daemon's default fits its own cap (asking for 25 s got a 422 from one capped lower)
  assert.equal(url.searchParams.has("timeout"), false);
  assert.deepEqual(calls[0].init.headers, { Authorization: "Bearer t" });
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

test("a send is retried with the same client_msg_id, then stored, then seen on the stream", async () => {
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
  assert.deepEqual(states, ["sending", "retrying", "stored", "echoed"]);
  client.stop();
});

test("a send carries the user's partition, the proxy's route to its leading API, and follows a new one", async () => {
  const urls = [];
  const fetchImpl = async (url) => {
    urls.push(url);
    return { status: 201, ok: true, json: async () => msg("20", { from: "bob", to: "alice", body: "hi" }) };
  };
  const unrouted = makeClient({ fetchImpl });
  await unrouted.client.send("alice", "hi").done;
  const { client } = makeClient({ fetchImpl, partition: 2 });
  await client.send("alice", "hi").done;
  client.follow(3, client.generation); // told another partition (a 421, client-config)
  await client.send("alice", "hi").done;
  assert.deepEqual(urls, ["/v1/messages", "/v1/messages?partition=2", "/v1/messages?partition=3"]);
});

test("a retried send goes to any API, not again to the leader that could not store it", async () => {
  const urls = [];
  let unavailable = 2;
  const fetchImpl = async (url) => {
    urls.push(url);
    if (unavailable-- > 0) {
      return { status: 503, ok: false, headers: { get: () => null }, json: async () => ({ error: "mysql_unavailable" }) };
    }
    return { status: 201, ok: true, json: async () => msg("20", { from: "bob", to: "alice", body: "hi" }) };
  };
  const { client } = makeClient({ fetchImpl, partition: 1 });
  await client.send("alice", "hi").done;
  assert.deepEqual(urls, ["/v1/messages?partition=1", "/v1/messages", "/v1/messages"]);
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

// The Web Storage interface (key/length/getItem/setItem/removeItem), in memory.
class MemoryStorage {
  constructor() { this.map = new Map(); }
  get length() { return this.map.size; }
  key(i) { return [...this.map.keys()][i] ?? null; }
  getItem(k) { return this.map.has(k) ? this.map.get(k) : null; }
  setItem(k, v) { this.map.set(k, String(v)); }
  removeItem(k) { this.map.delete(k); }
}

test("an unsent message outlives the page: the next start sends it with its client_msg_id", async () => {
  const storage = new MemoryStorage();
  storage.setItem("chat.outbox.alice.x1", JSON.stringify({ to: "carol", body: "not mine", at: 1 })); // another user's
  storage.setItem("chat.outbox.bob.junk", "not json");
  const down = async () => { throw new TypeError("network down"); };
  const first = makeClient({ storage, fetchImpl: down });
  first.client.start();
  const typed = [first.client.send("alice", "one"), first.client.send("alice", "two")];
  await tick();
  assert.equal(storage.length, 4); // both kept, in storage, while unsent
  first.client.stop(); // logged out: no more retries with this token
  for (const entry of typed) await assert.rejects(entry.done, /client stopped/);
  assert.equal(first.client.outbox.size, 0);

  const posted = [];
  const up = async (url, init) => {
    const sent = JSON.parse(init.body);
    posted.push(sent);
    return { status: 201, ok: true, json: async () => msg(String(20 + posted.length),
                                                           { from: "bob", to: sent.to, body: sent.body, client_msg_id: sent.client_msg_id }) };
  };
  const second = makeClient({ storage, fetchImpl: up });
  const states = [];
  second.client.addEventListener("outbox", (e) => states.push([e.detail.body, e.detail.state]));
  second.client.start();
  await Promise.all([...second.client.outbox.values()].map((entry) => entry.done));
  assert.deepEqual(posted.map((p) => [p.to, p.body]), [["alice", "one"], ["alice", "two"]]); // typed order
  const ids = posted.map((p) => p.client_msg_id);
  assert.deepEqual(ids, typed.map((entry) => entry.clientMsgId)); // the same ids as before
  assert.deepEqual(states, [["one", "sending"], ["two", "sending"], ["one", "stored"], ["two", "stored"]]);
  assert.deepEqual([...storage.map.keys()], ["chat.outbox.alice.x1", "chat.outbox.bob.junk"]); // stored: forgotten
  second.client.stop();
});

test("a refused message leaves the stored outbox; no storage at all still sends", async () => {
  const storage = new MemoryStorage();
  const refuse = async () => ({ status: 422, ok: false, json: async () => ({ error: "invalid_field", message: "bad" }) });
  const { client } = makeClient({ storage, fetchImpl: refuse });
  await assert.rejects(client.send("alice", "x").done, /bad/);
  assert.equal(storage.length, 0);

  const broken = { get length() { throw new Error("SecurityError"); }, getItem() { throw new Error("SecurityError"); },
                   setItem() { throw new Error("QuotaExceededError"); }, removeItem() { throw new Error("SecurityError"); } };
  const ok = async (url, init) => ({ status: 201, ok: true, json: async () => msg("30", JSON.parse(init.body)) });
  const other = makeClient({ storage: broken, fetchImpl: ok });
  other.client.start();
  const message = await other.client.send("alice", "still sent").done;
  assert.equal(message.id, "30");
  other.client.stop();
});

test("logging out discards the unsent outbox, here and in storage", async () => {
  const storage = new MemoryStorage();
  storage.setItem("chat.outbox.alice.x1", JSON.stringify({ to: "bob", body: "alice's", at: 1 }));
  const down = async () => { throw new TypeError("network down"); };
  const { client } = makeClient({ storage, fetchImpl: down });
  client.start();
  const entry = client.send("alice", "unsent");
  await tick();
  client.discardOutbox();
  client.stop();
  await assert.rejects(entry.done, /client stopped/);
  assert.deepEqual([...storage.map.keys()], ["chat.outbox.alice.x1"]); // only another user's is left
});

test("an expired token (close 4001) is renewed and the client resumes at once with since", async () => {
  let asked = 0;
  const { client, got } = makeClient({ renewToken: async () => `fresh${++asked}` });
  client.start();
  const first = FakeSocket.all[0];
  first.hello("10");
  first.frame(msg("11"));
  first.closed = true;
  first.onclose({ code: 4001 });
  await tick();
  assert.equal(asked, 1);
  const second = FakeSocket.all[1];
  second.open();
  assert.deepEqual(second.sent, [{ type: "auth", token: "fresh1" }]);
  assert.equal(since(second.url), "11");
  second.hello("11", true);
  second.frame(msg("12"));
  assert.deepEqual(got, ["11", "12"]);
  client.stop();
});

test("without renewToken an expired token is said to the page, and the client retries", async () => {
  const { client } = makeClient();
  let expired = 0;
  client.addEventListener("token-expired", () => expired++);
  client.start();
  FakeSocket.all[0].hello("10");
  FakeSocket.all[0].closed = true;
  FakeSocket.all[0].onclose({ code: 4001 });
  await tick();
  assert.equal(expired, 1);
  assert.equal(FakeSocket.all.length, 2); // retried, with the token it has
  client.stop();
});

test("a poll answered 401 renews the token and polls again with since", async () => {
  const urls = [];
  const tokens = [];
  const fetchImpl = async (url, init) => {
    urls.push(url);
    tokens.push(init.headers.Authorization);
    if (urls.length === 1) return { ok: false, status: 401, json: async () => ({}) };
    return new Promise(() => {}); // the next poll waits
  };
  const { client } = makeClient({ transport: "poll", fetchImpl, since: "7", renewToken: async () => "fresh" });
  client.start();
  await tick();
  assert.equal(urls.length, 2);
  assert.deepEqual(tokens, ["Bearer t", "Bearer fresh"]);
  assert.equal(since(urls[1]), "7");
  client.stop();
});

const param = (url, name) => new URL(url).searchParams.get(name);
const refusal = (partition) => ({ ok: false, status: 421, json: async () => ({ error: "wrong_partition", partition }) });

test("resumes with the last frame's cursor, routed to its partition", async () => {
  const { client } = makeClient({ partition: 1 });
  client.start();
  const first = FakeSocket.all[0];
  assert.equal(param(first.url, "partition"), "1");
  first.hello("1.0.10");
  first.frame(msg("11", { cursor: "1.0.11" }));
  first.drop();
  await tick();
  const second = FakeSocket.all[1];
  assert.equal(since(second.url), "1.0.11");
  assert.equal(param(second.url, "partition"), "1");
  client.stop();
});

// A fake of the poll endpoint and of the API's client-config: `poll` answers each poll (a reply, or
// null for one that waits), `config` is the partition client-config names (null: it cannot say).
function fakeServers({ poll = () => null, config = null } = {}) {
  const asked = { polls: [], configs: [] };
  const fetchImpl = async (url, init) => {
    if (new URL(url, "http://app").pathname === "/v1/client-config") {
      asked.configs.push({ url, init });
      if (config === null) throw new TypeError("API down");
      return { ok: true, status: 200, json: async () => ({ ws_url: "ws://d/v1/ws", partition: config }) };
    }
    asked.polls.push(url);
    return poll(url) ?? new Promise(() => {}); // a poll that waits
  };
  return { asked, fetchImpl, setConfig: (k) => { config = k; } };
}

test("a refused handshake asks the poll once; told another partition, it connects there at once", async () => {
  const { asked, fetchImpl } = fakeServers({ poll: () => refusal(1) });
  const { client, got } = makeClient({ partition: 0, since: "0.0.4", fetchImpl, backoffBaseMs: 5000, backoffMaxMs: 5000 });
  client.start();
  FakeSocket.all[0].drop(); // refused before hello: a page cannot see the 421
  await tick();
  assert.equal(asked.polls.length, 1);
  assert.equal(param(asked.polls[0], "partition"), "0");
  assert.equal(param(asked.polls[0], "timeout"), "0");
  assert.equal(since(asked.polls[0]), null); // it only asks
  assert.equal(asked.configs.length, 1); // told 421, it asks the API too (here down: the 421's answer stands)
  assert.equal(FakeSocket.all.length, 2); // at once, not after the 5 s backoff
  const second = FakeSocket.all[1];
  assert.equal(param(second.url, "partition"), "1");
  assert.equal(since(second.url), "0.0.4");
  second.hello("1.1.0", false);
  second.frame(msg("1", { cursor: "1.1.1" }));
  assert.deepEqual(got, ["1"]);
  client.stop();
});

test("told the partition it asked for already (a stale route), it backs off as after any failure", async () => {
  const { asked, fetchImpl } = fakeServers({ poll: () => refusal(1), config: 1 });
  const { client } = makeClient({ partition: 1, fetchImpl, backoffBaseMs: 5000, backoffMaxMs: 5000 });
  client.start();
  FakeSocket.all[0].drop();
  await tick();
  assert.equal(asked.polls.length, 1);
  assert.equal(asked.configs.length, 1); // the API agrees: nowhere else to go
  assert.equal(FakeSocket.all.length, 1); // no loop: the next try waits for the backoff
  assert.equal(client.wsFailures, 1);
  assert.equal(client.partition, 1);
  client.stop();
});

test("told by a 421 the route it took, and by client-config another partition, it connects there at once", async () => {
  // A daemon still on the old slot map names the old partition; the API, on the new one, the new.
  const { asked, fetchImpl } = fakeServers({ poll: () => refusal(0), config: 2 });
  const { client } = makeClient({ partition: 0, since: "0.0.9", fetchImpl, backoffBaseMs: 5000, backoffMaxMs: 5000 });
  client.start();
  FakeSocket.all[0].drop();
  await tick();
  assert.equal(asked.configs.length, 1);
  assert.deepEqual(asked.configs[0].init.headers, { Authorization: "Bearer t" }); // the user's own partition
  assert.equal(FakeSocket.all.length, 2);
  assert.equal(param(FakeSocket.all[1].url, "partition"), "2");
  assert.equal(since(FakeSocket.all[1].url), "0.0.9");
  client.stop();
});

test("a poll answered 421 asks client-config and polls again at once where they say, with since", async () => {
  let polls = 0;
  const { asked, fetchImpl } = fakeServers({ poll: () => (++polls === 1 ? refusal(2) : null), config: 3 });
  const { client } = makeClient({ transport: "poll", fetchImpl, since: "0.0.7" });
  client.start();
  await tick();
  assert.equal(asked.polls.length, 2);
  assert.equal(param(asked.polls[0], "partition"), null);
  assert.equal(asked.configs.length, 1);
  assert.equal(param(asked.polls[1], "partition"), "3"); // the API's answer before the 421's
  assert.equal(since(asked.polls[1]), "0.0.7");
  client.stop();
});

test("a poll answered 421 with the API down polls again at once where the 421 says", async () => {
  let polls = 0;
  const { asked, fetchImpl } = fakeServers({ poll: () => (++polls === 1 ? refusal(2) : null) });
  const { client } = makeClient({ transport: "poll", fetchImpl, since: "0.0.7" });
  client.start();
  await tick();
  assert.equal(asked.configs.length, 1);
  assert.equal(param(asked.polls[1], "partition"), "2");
  client.stop();
});

test("closed with 1012 (its slot moved), it asks client-config after the backoff and reconnects where it says", async () => {
  const { asked, fetchImpl, setConfig } = fakeServers({ config: 0 });
  const { client, got } = makeClient({ partition: 0, fetchImpl });
  client.start();
  const first = FakeSocket.all[0];
  first.hello("0.0.5");
  first.frame(msg("6", { cursor: "0.0.6" }));
  assert.equal(asked.configs.length, 0); // the page asked at start: nothing to ask while live
  setConfig(1); // the user's slot moves to partition 1; its daemon closes the socket
  first.drop();
  assert.equal(asked.configs.length, 0); // not at once: after the usual backoff
  await tick();
  assert.equal(asked.configs.length, 1);
  assert.equal(FakeSocket.all.length, 2);
  const second = FakeSocket.all[1];
  assert.equal(param(second.url, "partition"), "1");
  assert.equal(since(second.url), "0.0.6"); // the new partition's daemon says recovered: false
  second.hello("1.1.0", false);
  second.frame(msg("1", { cursor: "1.1.1" }));
  assert.deepEqual(got, ["6", "1"]);
  client.stop();
});

test("closed with 1012 and client-config unreachable or unchanged, it reconnects to its route", async () => {
  for (const config of [null, 0]) {
    const { asked, fetchImpl } = fakeServers({ config });
    const { client } = makeClient({ partition: 0, fetchImpl });
    client.start();
    FakeSocket.all[0].hello("0.0.5");
    FakeSocket.all[0].drop();
    await tick();
    assert.equal(asked.configs.length, 1);
    assert.equal(FakeSocket.all.length, 2);
    assert.equal(param(FakeSocket.all[1].url, "partition"), "0");
    client.stop();
  }
});

test("a client that does not route by partition asks nothing after a 1012, nor after other closes", async () => {
  const { asked, fetchImpl } = fakeServers({ config: 1 });
  const { client } = makeClient({ fetchImpl });
  client.start();
  FakeSocket.all[0].hello("5");
  FakeSocket.all[0].drop();
  await tick();
  assert.equal(FakeSocket.all.length, 2);
  client.stop();
  const routed = makeClient({ partition: 0, fetchImpl }).client;
  routed.start();
  FakeSocket.all[0].hello("0.0.5");
  FakeSocket.all[0].closed = true;
  FakeSocket.all[0].onclose({ code: 1011 }); // a server error, not a move
  await tick();
  assert.equal(asked.configs.length, 0);
  assert.equal(param(FakeSocket.all[1].url, "partition"), "0");
  routed.stop();
});

test("stopped while asking client-config after a 1012, it connects nowhere", async () => {
  let answer;
  const fetchImpl = () => new Promise((resolve) => { answer = resolve; });
  const { client } = makeClient({ partition: 0, fetchImpl });
  client.start();
  FakeSocket.all[0].hello("0.0.5");
  FakeSocket.all[0].drop();
  await tick();
  client.stop();
  answer({ ok: true, status: 200, json: async () => ({ partition: 1 }) });
  await tick();
  assert.equal(FakeSocket.all.length, 1);
});

test("after recovered: false the ids seen before are new messages (a slot moved)", async () => {
  const { client, got } = makeClient();
  let resets = 0;
  client.addEventListener("reset", () => resets++);
  client.start();
  const first = FakeSocket.all[0];
  first.hello("0");
  first.frame(msg("1"));
  first.frame(msg("2"));
  first.drop();
  await tick();
  const second = FakeSocket.all[1];
  second.hello("1.1.0", false); // now in partition 1, which numbers from 1 again
  second.frame(msg("1", { cursor: "1.1.1" }));
  second.frame(msg("1", { cursor: "1.1.1" })); // a true repeat is still dropped
  assert.equal(resets, 1);
  assert.deepEqual(got, ["1", "2", "1"]);
  assert.equal(client.since, "1.1.1");
  client.stop();
});

test("the token goes in the first frame once the socket opens, never in the URL", async () => {
  const { client } = makeClient({ since: "5" });
  client.start();
  const ws = FakeSocket.all[0];
  assert.equal(new URL(ws.url).searchParams.has("token"), false);
  assert.deepEqual(ws.sent, []);
  ws.open();
  assert.deepEqual(ws.sent, [{ type: "auth", token: "t" }]);
  client.stop();
});

test("a refused auth frame (close 4401) renews the token and reconnects", async () => {
  let asked = 0;
  const { client } = makeClient({ renewToken: async () => `fresh${++asked}` });
  client.start();
  FakeSocket.all[0].open();
  FakeSocket.all[0].closed = true;
  FakeSocket.all[0].onclose({ code: 4401, reason: "token expired" });
  await tick();
  assert.equal(asked, 1);
  FakeSocket.all[1].open();
  assert.deepEqual(FakeSocket.all[1].sent, [{ type: "auth", token: "fresh1" }]);
  client.stop();
});

test("told by a 4421 close which partition serves the user, it connects there at once", async () => {
  for (const [config, expected] of [[null, "1"], [2, "2"], [0, "1"]]) { // API down; it names another; it names ours
    const { asked, fetchImpl } = fakeServers({ config });
    const { client } = makeClient({ partition: 0, fetchImpl, backoffBaseMs: 5000, backoffMaxMs: 5000 });
    client.start();
    FakeSocket.all[0].closed = true;
    FakeSocket.all[0].onclose({ code: 4421, reason: JSON.stringify({ partition: 1 }) });
    await tick();
    assert.equal(asked.configs.length, 1);
    assert.equal(FakeSocket.all.length, 2); // at once: not after the 5 s backoff
    assert.equal(param(FakeSocket.all[1].url, "partition"), expected);
    client.stop();
  }
});

test("a 4421 naming the route it took, with the API agreeing, backs off as a failed attempt", async () => {
  const { fetchImpl } = fakeServers({ config: 0 });
  const { client } = makeClient({ partition: 0, fetchImpl, backoffBaseMs: 5000, backoffMaxMs: 5000 });
  client.start();
  FakeSocket.all[0].closed = true;
  FakeSocket.all[0].onclose({ code: 4421, reason: JSON.stringify({ partition: 0 }) });
  await tick();
  assert.equal(FakeSocket.all.length, 1);
  assert.equal(client.wsFailures, 1);
  client.stop();
});

test("the next route: the API's answer, else the refusal's, whichever names another partition", () => {
  assert.equal(nextRoute(0, 2, 1), 2);
  assert.equal(nextRoute(0, 0, 1), 1); // the API names the route that failed: the refusal's
  assert.equal(nextRoute(0, null, 1), 1);
  assert.equal(nextRoute(0, null, 0), 0); // nothing new: back off
  assert.equal(nextRoute(null, null, null), null);
  assert.equal(nextRoute(null, 0, null), 0); // a client that did not route learns its route
});

// ---- receipts (docs/receipts.md) ----------------------------------------------------

const sentOfType = (ws, type) => ws.sent.filter((f) => f.type === type);

test("events are frames of the stream: deduplicated, resumed from, and told apart from messages", async () => {
  const { client, got } = makeClient();
  const events = [];
  const refusals = [];
  client.addEventListener("event", (e) => events.push([e.detail.type, e.detail.id]));
  client.addEventListener("refusal", (e) => refusals.push(e.detail.code));
  client.start();
  const ws = FakeSocket.all[0];
  ws.hello("10");
  ws.frame(msg("11"));
  ws.frame({ type: "edit", id: "12", from: "alice", to: "bob", ref: "11", body: "m11!" });
  ws.frame({ type: "edit", id: "12", from: "alice", to: "bob", ref: "11", body: "m11!" }); // a repeat
  ws.frame({ type: "read", id: "13", from: "alice", to: "bob", upto: "9" });
  ws.frame({ type: "error", code: "message_not_found", message: "no", frame: "read" });
  assert.deepEqual(got, ["11"]);
  assert.deepEqual(events, [["edit", "12"], ["read", "13"]]);
  assert.deepEqual(refusals, ["message_not_found"]);
  assert.equal(client.since, "13");
  ws.drop();
  await tick();
  assert.equal(since(FakeSocket.all[1].url), "13");
  client.stop();
});

test("the device goes on the handshake; acks say the newest message received, coalesced", async () => {
  const { client } = makeClient({ device: "web-1", receiptDelayMs: 1, receiptIntervalMs: 60 });
  client.start();
  const ws = FakeSocket.all[0];
  assert.equal(param(ws.url, "device"), "web-1");
  ws.open();
  ws.hello("10");
  ws.frame(msg("11"));
  ws.frame(msg("12"));
  ws.frame({ type: "delivered", id: "13", from: "alice", to: "bob", upto: "7" }); // an event: no message to ack
  await tick(20);
  assert.deepEqual(sentOfType(ws, "ack"), [{ type: "ack", upto: "12" }]); // one ack for the burst
  ws.frame(msg("14"));
  ws.frame(msg("15"));
  await tick(5);
  assert.equal(sentOfType(ws, "ack").length, 1); // within the interval: waits, latest wins
  await tick(100);
  assert.deepEqual(sentOfType(ws, "ack"), [{ type: "ack", upto: "12" }, { type: "ack", upto: "15" }]);
  client.stop();
});

test("read markers: the newest per peer, once; what waited for a socket goes after its hello", async () => {
  const { client } = makeClient({ receiptDelayMs: 1, receiptIntervalMs: 1 });
  client.start();
  const first = FakeSocket.all[0];
  first.hello("10");
  client.markRead("alice", "8");
  client.markRead("alice", "9");
  client.markRead("carol", "5");
  client.markRead("alice", "7"); // older than what waits: nothing
  await tick();
  assert.deepEqual(sentOfType(first, "read"), [
    { type: "read", peer: "alice", upto: "9" }, { type: "read", peer: "carol", upto: "5" }]);
  client.markRead("alice", "9"); // said already
  await tick();
  assert.equal(sentOfType(first, "read").length, 2);
  first.drop();
  client.markRead("alice", "11"); // no live socket: it waits
  await tick();
  const second = FakeSocket.all[1];
  assert.deepEqual(sentOfType(second, "read"), []);
  second.hello("11", true);
  await tick();
  assert.deepEqual(sentOfType(second, "read"), [{ type: "read", peer: "alice", upto: "11" }]);
  client.stop();
});

test("long-polling, acks and read markers go over HTTP with the device", async () => {
  const posts = [];
  let polls = 0;
  const fetchImpl = async (url, init) => {
    if (init.method === "POST") {
      posts.push([new URL(url).pathname, JSON.parse(init.body), init.headers.Authorization]);
      return { ok: true, status: 200, json: async () => ({}) };
    }
    if (polls++ === 0) {
      return { ok: true, status: 200, json: async () => ({ recovered: true, cursor: "21", unread: 3,
                                                            messages: [msg("20"), msg("21")] }) };
    }
    return new Promise(() => {}); // the next poll waits
  };
  const { client } = makeClient({ apiUrl: "http://api", transport: "poll", fetchImpl, device: "web-2", receiptDelayMs: 1,
                                   receiptIntervalMs: 1 });
  const unread = [];
  client.addEventListener("unread", (e) => unread.push(e.detail));
  client.start();
  await tick();
  client.markRead("alice", "21");
  await tick(30);
  assert.deepEqual(unread, [3]);
  assert.deepEqual(posts, [
    ["/v1/acks", { upto: "21", device: "web-2" }, "Bearer t"],
    ["/v1/read", { peer: "alice", upto: "21" }, "Bearer t"],
  ]);
  client.stop();
});

test("many read markers at once go a few per flush, under the daemon's frame rate", async () => {
  const { client } = makeClient({ receiptDelayMs: 1, receiptIntervalMs: 40 });
  client.start();
  const ws = FakeSocket.all[0];
  ws.hello("10");
  ws.frame(msg("11"));
  for (let i = 1; i <= 6; i++) client.markRead(`peer${i}`, String(i));
  await tick(20);
  assert.equal(ws.sent.length, 4); // the ack and three markers
  await tick(80);
  assert.deepEqual(sentOfType(ws, "read").map((f) => f.peer), ["peer1", "peer2", "peer3", "peer4", "peer5", "peer6"]);
  client.stop();
});

// Typing and presence (docs/presence.md): signals beside the stream, never part of it.

const TYPING = { type: "typing", from: "alice", to: "bob", state: "start", ttl: 5 };
const SNAPSHOT = { type: "presence", users: [{ user: "alice", online: true, last_seen: null }] };
const CHANGE = { type: "presence", user: "alice", online: false, last_seen: "2026-11-26T13:01:02.345Z" };
const sentOf = (ws, type) => ws.sent.filter((f) => f.type === type);

test("typing and presence frames reach the page as signals: no message, no resume point, no ack", () => {
  const { client, got } = makeClient();
  const typings = [];
  const presences = [];
  client.addEventListener("typing", (e) => typings.push(e.detail));
  client.addEventListener("presence", (e) => presences.push(e.detail));
  client.start();
  const ws = FakeSocket.all[0];
  ws.hello("7");
  ws.frame(msg("8"));
  for (const frame of [TYPING, SNAPSHOT, CHANGE]) ws.frame(frame);
  assert.deepEqual(typings, [TYPING]);
  assert.deepEqual(presences, [SNAPSHOT, CHANGE]);
  assert.deepEqual(got, ["8"]);
  assert.equal(client.since, "8");
  assert.equal(client.ackUpto, "8");
  client.stop();
});

test("typing goes on the live socket; before the hello it is dropped, never queued", () => {
  const { client } = makeClient();
  client.start();
  const ws = FakeSocket.all[0];
  client.typing("alice", "start"); // not live yet
  ws.hello("7");
  client.typing("alice", "start");
  client.typing("alice", "stop");
  assert.deepEqual(sentOf(ws, "typing"), [{ type: "typing", to: "alice", state: "start" },
                                          { type: "typing", to: "alice", state: "stop" }]);
  client.stop();
  client.typing("alice", "start"); // stopped: nothing
  assert.equal(sentOf(ws, "typing").length, 2);
});

test("the watch list goes after each hello and when it changes, one frame per interval at most", () => {
  const { client, win } = makeClient({ watchIntervalMs: 60_000 });
  client.start();
  client.watch(["alice", "carol"]); // no socket yet: kept for its hello
  const first = FakeSocket.all[0];
  first.hello("7");
  assert.deepEqual(sentOf(first, "watch"), [{ type: "watch", users: ["alice", "carol"] }]);
  client.watch(["alice", "carol", "alice"]); // the same list: nothing
  client.watch(["carol", "alice"]); // the same users, reordered (a conversation moved up): nothing
  assert.equal(client.watchTimer, null);
  client.watch(["carol", "alice", "dave"]); // changed, but a watch went just now: it waits for the interval
  assert.notEqual(client.watchTimer, null);
  assert.equal(sentOf(first, "watch").length, 1);
  win.dispatchEvent(new Event("offline"));
  win.dispatchEvent(new Event("online")); // a new socket, which watches nobody until told
  const second = FakeSocket.all[1];
  assert.deepEqual(sentOf(second, "watch"), []);
  second.hello("7", true);
  assert.deepEqual(sentOf(second, "watch"), [{ type: "watch", users: ["carol", "alice", "dave"] }]); // the newest
  client.stop();
});

test("a change of the watch list goes at once when none went within the interval; at most 200 users", () => {
  const { client } = makeClient({ watchIntervalMs: 0 });
  client.start();
  const ws = FakeSocket.all[0];
  ws.hello("7");
  assert.deepEqual(sentOf(ws, "watch"), []); // nobody to watch: no frame
  client.watch(["alice"]);
  client.watch(Array.from({ length: 250 }, (_, i) => `u${i}`));
  client.watch([]); // cleared: said too
  const watches = sentOf(ws, "watch").map((f) => f.users);
  assert.deepEqual(watches[0], ["alice"]);
  assert.equal(watches[1].length, 200);
  assert.deepEqual(watches[2], []);
  client.stop();
});

test("long-polling: the answer's signals reach the page, typing is a POST, presence is asked of the API", async () => {
  const calls = [];
  let polls = 0;
  const fetchImpl = async (url, init) => {
    const { pathname, searchParams } = new URL(url, "http://api");
    calls.push({ pathname, searchParams, init });
    if (pathname === "/v1/poll") {
      if (++polls > 1) return new Promise(() => {}); // the next poll waits
      return { status: 200, ok: true, json: async () => ({ messages: [msg("8")], cursor: "8", recovered: false,
                                                           unread: 0, signals: [TYPING] }) };
    }
    if (pathname === "/v1/presence") {
      const users = searchParams.get("users").split(",").map((user) => ({ user, online: true, last_seen: null }));
      return { status: 200, ok: true, json: async () => ({ users }) };
    }
    return { status: 202, ok: true, json: async () => ({ sent: true }) };
  };
  const { client } = makeClient({ transport: "poll", fetchImpl });
  const typed = once(client, "typing");
  const told = once(client, "presence");
  client.watch(["alice"]);
  client.start();
  assert.deepEqual((await typed)[0].detail, TYPING);
  assert.deepEqual((await told)[0].detail, SNAPSHOT); // asked when polling began: no socket watches
  const asked = calls.filter((c) => c.pathname === "/v1/presence");
  assert.deepEqual(asked[0].init.headers, { Authorization: "Bearer t" });

  client.typing("alice", "start");
  const posted = calls.filter((c) => c.pathname === "/v1/typing");
  assert.deepEqual(posted.map((c) => JSON.parse(c.init.body)), [{ to: "alice", state: "start" }]);
  assert.equal(posted[0].init.method, "POST");

  const again = once(client, "presence");
  client.watch(["alice", "carol"]); // a new list: asked at once
  assert.deepEqual((await again)[0].detail.users.map((u) => u.user), ["alice", "carol"]);
  client.stop();
});

test("long-polling against a server with presence off: one 404, then no more asking", async () => {
  let asked = 0;
  const fetchImpl = async (url) => {
    if (new URL(url, "http://api").pathname !== "/v1/presence") return new Promise(() => {});
    asked += 1;
    return { status: 404, ok: false, json: async () => ({ error: "presence_disabled", message: "off" }) };
  };
  const { client } = makeClient({ transport: "poll", fetchImpl });
  client.start();
  client.watch(["alice"]);
  await client.presenceAsking;
  assert.equal(client.presenceOff, true);
  client.watch(["alice", "carol"]);
  client.askPresence();
  assert.equal(asked, 1);
  client.stop();
});
