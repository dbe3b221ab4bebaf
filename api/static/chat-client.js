// The reference browser client: connection, resume, dedup and outbox. No DOM code.
//
//   const client = new ChatClient({ apiUrl: "", wsUrl, pollUrl, token, user, partition });
//   client.addEventListener("message", (e) => show(e.detail));       // each message once, in order
//   client.addEventListener("event", (e) => apply(e.detail));        // edit|delete|read|delivered, in stream order
//   client.addEventListener("unread", (e) => total(e.detail));       // hello/poll's total unread count
//   client.addEventListener("status", (e) => indicator(e.detail));   // connecting|live|reconnecting|polling|offline
//   client.addEventListener("reset", () => reloadHistory());         // hello/poll said recovered: false
//   client.addEventListener("outbox", (e) => mark(e.detail));        // {clientMsgId, state, message?, error?}
//   client.start();
//   client.send("bob", "hello");                                     // retried with one client_msg_id
//   client.markRead("bob", "42");                                    // I have read bob's messages up to 42
//   client.addEventListener("typing", (e) => typing(e.detail));      // a typing frame (signals.js reads it)
//   client.addEventListener("presence", (e) => presence(e.detail));  // a presence snapshot or change
//   client.typing("bob", "start");                                   // I am typing to bob (or "stop")
//   client.watch(["bob", "carol"]);                                  // tell me when they come and go
//
// Rules (README, "Web client"):
// - Resume with `since`: the last message's `cursor` (its id when it has none), or
//   the hello/poll cursor while nothing was received yet (or when ours could not be served).
// - Drop repeats by id; the stream is in order, so arrival order is the order. When the
//   server cannot resume us (`recovered: false`) the stream starts over: the ids seen
//   are forgotten (after a slot move the new partition's ids may equal old ones).
// - Partitions: `/v1/ws`, `/v1/poll` and each send carry `partition=k` when the client knows the
//   user's partition (`GET /v1/client-config` with the token says it). A daemon of another
//   partition refuses with 421 and names the user's: the poll reads it, a WebSocket whose
//   auth frame named such a user is closed with 4421 and the partition; a refused WebSocket
//   handshake does not show its status to a page, so a client with a partition then asks
//   the poll endpoint once (`timeout=0`). Told 421, the client asks client-config again and
//   connects at once to the first of its answer and the 421's that is another partition
//   (`nextRoute`); else it backs off as after any failure. A client that routes by partition
//   also asks client-config before reconnecting after a 1012 (after the usual backoff): a
//   daemon closes a user's socket so when its slot moves, and the user's new partition is
//   served by other daemons.
// - Reconnect with exponential backoff and full jitter; after `wsFailuresBeforePoll`
//   WebSocket attempts in a row that never reached hello (or with no WebSocket at
//   all) use the long-poll endpoint, and try the WebSocket again now and then.
// - `offline` closes the socket and stops retrying until `online` (or a long timer);
//   `online` reconnects at once with `since` and flushes the outbox.
// - A token that expires (close 4001, or a poll answered 401) is renewed with the
//   app's `renewToken()`, and the client resumes at once with `since`.
// - A message not yet stored is also kept in `storage` (localStorage), one key per
//   message, until the API has stored it or refused it: `start()` sends what a
//   reload or a closed tab left behind, with its client_msg_id, so it is stored
//   exactly once. One key per message, so two tabs of one user never overwrite
//   each other's outbox; both may resend a message, and the API keeps one.
// - Receipts (docs/receipts.md): edits, deletes, read markers and delivery receipts
//   are frames of the same stream, with ids: deduplicated and resumed like messages.
//   The client acknowledges the messages it received (`ack`, up to the newest one's
//   id) and sends the page's read markers (`read`, per peer): on the WebSocket once
//   it is live, else over HTTP (POST /v1/acks, /v1/read) while it long-polls.
//   Coalesced: at most one flush per `receiptIntervalMs`, each with the newest ack and
//   the newest marker per peer (a flood becomes one frame each, never a queue).
//   `device` (the page keeps one per browser) names what an ack counts for.
// - Signals (docs/presence.md): typing and presence frames have no id and are no part of the
//   stream (never resumed, never deduplicated); the page hears them as `typing` and
//   `presence` events, from the socket or from a poll answer's `signals`. `typing()` sends a
//   frame on the live socket, or POST /v1/typing while long-polling, and is dropped otherwise
//   (a signal is never queued). `watch()` sends the users to watch after each hello and when
//   the list changes (at most one `watch` frame per `watchIntervalMs`); while long-polling
//   the client asks GET /v1/presence instead, when the list changes and every
//   `presencePollMs`.

import {
  SeenIds, backoffDelay, compareIds, nextRoute, partitionOf, partitionOfClose, partitionOfConfig,
} from "./connection-rules.js";
import { StoredOutbox } from "./stored-outbox.js";
import { sameUsers, watchList } from "./signals.js";

export { SeenIds, backoffDelay, compareIds, nextRoute, partitionOf, partitionOfClose, partitionOfConfig };

// An entry only moves right, or to "failed". "echoed": seen on the stream (stored, like
// "stored"; whether the peer has it is told by `delivered` and `read` events).
const STATES = ["sending", "retrying", "stored", "echoed"];
const TOKEN_EXPIRED = 4001; // the daemon's close when a socket's token passes its exp
const UNAUTHORIZED = 4401; // the auth frame's token was refused (expired, or not valid)
const WRONG_PARTITION = 4421; // the user is served by another partition's daemons: the reason names it
const RESTARTING = 1012; // the daemon restarts, or the user's slot moved to another partition's daemons
// Receipt frames per flush (an ack and read markers): the rest waits for the next flush, so a
// client that read many conversations stays well under the daemon's inbound frame rate (1008).
const RECEIPT_FRAMES_PER_FLUSH = 4;

export class ChatClient extends EventTarget {
  constructor({
    apiUrl = "", wsUrl, pollUrl, token, user, since = null, partition = null, transport = "auto",
    wsFailuresBeforePoll = 4, wsRetryFromPollMs = 30000, helloTimeoutMs = 10000,
    backoffBaseMs = 300, backoffMaxMs = 10000, offlineRetryMs = 30000, pollTimeoutSeconds = null,
    configTimeoutMs = 2000,
    WebSocketImpl = globalThis.WebSocket, fetchImpl = globalThis.fetch?.bind(globalThis),
    eventSource = globalThis.window, storage = globalThis.localStorage ?? null, renewToken = null,
    device = null, receiptDelayMs = 100, receiptIntervalMs = 1000, watchIntervalMs = 1000, presencePollMs = 30000,
  }) {
    super();
    Object.assign(this, {
      apiUrl, wsUrl, pollUrl, token, user, since, partition, wsFailuresBeforePoll, wsRetryFromPollMs, helloTimeoutMs,
      backoffBaseMs, backoffMaxMs, offlineRetryMs, pollTimeoutSeconds, configTimeoutMs, WebSocketImpl, fetchImpl,
      eventSource,
      storage, renewToken, // async () => a fresh token from the app's identity provider
      device, receiptDelayMs, receiptIntervalMs, watchIntervalMs, presencePollMs,
    });
    this.stored = new StoredOutbox(storage, user);
    this.forced = transport === "poll" ? "poll" : null;
    this.transport = null; // "ws" | "poll" while running
    this.status = "idle";
    this.seen = new SeenIds();
    this.outbox = new Map(); // clientMsgId -> entry
    this.attempt = 0; // consecutive failures of the current transport
    this.askRoute = false; // closed with 1012: ask client-config for the user's partition before the next connect
    this.wsFailures = 0; // consecutive WebSocket attempts that never reached hello
    this.pollSince = 0; // when the fallback to poll began (ms)
    this.running = false;
    this.offline = false;
    this.ws = null;
    this.liveWs = null; // this.ws once its hello came: receipts go on it
    this.pollAbort = null;
    this.ackUpto = null; // the newest message id received: what the next ack says
    this.ackedUpto = null; // what the last ack said
    this.reads = new Map(); // peer -> the read marker to send
    this.readsSent = new Map(); // peer -> the marker sent on this connection (or over HTTP)
    this.receiptTimer = null;
    this.receiptsBusy = false; // an HTTP flush under way
    this.lastReceiptsAt = -Infinity; // when the last flush went (ms)
    this.watching = []; // the users whose presence the page wants (watchList: ids, each once, at most 200)
    this.watchSent = null; // the list the last `watch` frame said...
    this.watchSentOn = null; // ...and the socket it went on (a new socket watches nobody)
    this.lastWatchAt = -Infinity;
    this.watchTimer = null;
    this.presenceAskedAt = -Infinity; // long-polling: when GET /v1/presence was last asked
    this.presenceOff = false; // GET /v1/presence answered 404: presence is off on this server
    this.presenceAsking = null;
    this.timer = null;
    this.generation = 0; // bumps on every (re)connect; stale callbacks compare and leave
    this.onOffline = () => this.goOffline();
    this.onOnline = () => this.goOnline();
  }

  // ---- lifecycle ---------------------------------------------------------

  start() {
    if (this.running) return;
    this.running = true;
    this.stopped = false;
    this.eventSource?.addEventListener?.("offline", this.onOffline);
    this.eventSource?.addEventListener?.("online", this.onOnline);
    if (globalThis.navigator?.onLine === false) this.goOffline();
    else this.connect();
    for (const saved of this.stored.saved()) {
      if (!this.outbox.has(saved.clientMsgId)) this.send(saved.to, saved.body, saved.clientMsgId);
    }
  }

  // Stops receiving and sending. A message still unsent stays in `storage` for the
  // next start (of this user, in any tab); it is not retried with a stale token.
  stop() {
    this.running = false;
    this.stopped = true;
    this.eventSource?.removeEventListener?.("offline", this.onOffline);
    this.eventSource?.removeEventListener?.("online", this.onOnline);
    this.disconnect();
    clearTimeout(this.receiptTimer);
    this.receiptTimer = null;
    for (const entry of this.outbox.values()) {
      if (entry.waiting) entry.wake();
    }
    this.setStatus("idle");
  }

  goOffline() {
    if (!this.running) return;
    this.offline = true;
    this.disconnect(); // Chromium's offline mode leaves an open WebSocket open: close it ourselves
    this.setStatus("offline");
    // `online` may never fire (a captive portal, a flaky event): try again later anyway.
    this.timer = setTimeout(() => this.goOnline(), this.offlineRetryMs);
  }

  goOnline() {
    if (!this.running || !this.offline) return;
    this.offline = false;
    this.attempt = 0;
    this.disconnect();
    this.connect();
    for (const entry of this.outbox.values()) {
      if (entry.waiting) entry.wake();
    }
  }

  disconnect() {
    this.generation += 1;
    clearTimeout(this.timer);
    this.timer = null;
    clearTimeout(this.watchTimer);
    this.watchTimer = null;
    this.liveWs = null;
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      try { ws.close(1000, "client closing"); } catch { /* already closed */ }
    }
    if (this.pollAbort) {
      this.pollAbort.abort();
      this.pollAbort = null;
    }
  }

  setStatus(status) {
    if (status === this.status) return;
    this.status = status;
    this.dispatchEvent(new CustomEvent("status", { detail: status }));
  }

  // ---- receiving -------------------------------------------------------------

  // The resume rule of chatctl/client.py Inbox.accept, for hello frames and poll answers.
  acceptCursor(cursor, recovered) {
    const hadSince = this.since !== null;
    if (!hadSince || !recovered) this.since = cursor;
    if (hadSince && !recovered) this.startOver();
  }

  // The server could not resume us: the stream starts over at its cursor, and every id
  // from now on is new (after a slot move, ids of another partition: they may equal old ones).
  startOver() {
    this.seen = new SeenIds(this.seen.limit);
    // ids of the old stream mean nothing in the new one: no receipt names them
    this.ackUpto = null;
    this.ackedUpto = null;
    this.reads.clear();
    this.readsSent.clear();
    this.dispatchEvent(new CustomEvent("reset"));
  }

  // A frame of the stream: a message, or an event (edit, delete, read, delivered) about one.
  acceptFrame(frame) {
    if (!this.seen.add(frame.id)) return false;
    this.since = frame.cursor ?? frame.id; // a cursor also says the partition and epoch it was made in
    if (frame.type !== "message") {
      this.dispatchEvent(new CustomEvent("event", { detail: frame }));
      return true;
    }
    const entry = frame.client_msg_id && frame.from === this.user ? this.outbox.get(frame.client_msg_id) : null;
    if (entry) this.advance(entry, "echoed", frame);
    this.dispatchEvent(new CustomEvent("message", { detail: frame }));
    if (!frame.deleted) this.received(frame.id);
    return true;
  }

  acceptUnread(unread) {
    if (Number.isInteger(unread)) this.dispatchEvent(new CustomEvent("unread", { detail: unread }));
  }

  connect() {
    if (!this.running || this.offline) return;
    if (this.askRoute) {
      this.askRoute = false;
      this.rerouted(this.generation);
      return;
    }
    const wantPoll = this.forced === "poll" || !this.WebSocketImpl
      || (this.wsFailures >= this.wsFailuresBeforePoll
          && Date.now() - this.pollSince < this.wsRetryFromPollMs);
    if (wantPoll) this.connectPoll();
    else this.connectWs();
  }

  retryLater() {
    if (!this.running || this.offline) return;
    this.attempt += 1;
    const delay = backoffDelay(this.attempt, this.backoffBaseMs, this.backoffMaxMs);
    this.setStatus(this.transport === "poll" ? "polling" : "reconnecting");
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  withSince(base, params) {
    const query = new URLSearchParams(params); // never the token: proxies and history keep URLs
    if (this.since !== null) query.set("since", this.since);
    if (this.partition !== null) query.set("partition", String(this.partition));
    return `${base}?${query}`;
  }

  // After a 1012, before connecting: where client-config says the user is now (unchanged when it
  // cannot say). Nothing else runs meanwhile: the backoff has passed, and no connection is open.
  async rerouted(gen) {
    const told = await this.askConfig();
    if (gen !== this.generation) return; // stopped, or offline, while asking
    this.partition = nextRoute(this.partition, told, null);
    this.connect();
  }

  // Refused with a 421 (`told`: the partition it named, or null): ask client-config too, and
  // follow the first answer that names another partition (nextRoute). False when neither does.
  async followRefusal(told, gen) {
    const fromApi = await this.askConfig();
    return this.follow(nextRoute(this.partition, fromApi, told), gen);
  }

  // The user's partition as `GET /v1/client-config` says it with the user's token, else null
  // (no answer within configTimeoutMs, or none that names one).
  async askConfig() {
    if (!this.fetchImpl) return null;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), this.configTimeoutMs);
    try {
      const reply = await this.fetchImpl(`${this.apiUrl}/v1/client-config`, this.pollInit(abort));
      return await partitionOfConfig(reply);
    } catch {
      return null;
    } finally {
      clearTimeout(timer);
    }
  }

  // Told the user's partition (a 421's, or client-config's): route there from now on, and
  // connect at once. False when it is the one we already asked for (a stale route: back off
  // as usual), or the client moved on meanwhile.
  follow(partition, gen) {
    if (partition === null || partition === this.partition || gen !== this.generation) return false;
    this.partition = partition;
    this.askRoute = false; // just decided
    this.attempt = 0;
    this.wsFailures = 0;
    this.connect();
    return true;
  }

  // A WebSocket refused before hello, for a client that routes by partition: the page
  // cannot read the handshake's status, so ask the poll endpoint, which refuses a user
  // of another partition the same way (421, naming it). No since: it only asks.
  async askPartition() {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), this.helloTimeoutMs);
    const query = new URLSearchParams({ partition: String(this.partition), timeout: "0" });
    try {
      const reply = await this.fetchImpl(`${this.pollUrl}?${query}`, this.pollInit(abort));
      return await partitionOf(reply);
    } catch {
      return null;
    } finally {
      clearTimeout(timer);
    }
  }

  pollInit(abort) {
    return { signal: abort.signal, cache: "no-store", headers: { Authorization: `Bearer ${this.token}` } };
  }

  connectWs() {
    const gen = ++this.generation;
    this.transport = "ws";
    if (this.status !== "live") this.setStatus(this.attempt ? "reconnecting" : "connecting");
    let hello = false;
    let ws;
    try {
      ws = new this.WebSocketImpl(this.withSince(this.wsUrl, this.device ? { device: this.device } : {}));
    } catch {
      this.wsFailed(gen);
      return;
    }
    this.ws = ws;
    // A browser cannot set headers on a WebSocket: the token goes in the first frame.
    ws.onopen = () => ws.send(JSON.stringify({ type: "auth", token: this.token }));
    const helloTimer = setTimeout(() => { if (!hello) ws.close(); }, this.helloTimeoutMs);
    ws.onmessage = (event) => {
      if (gen !== this.generation) return;
      const frame = JSON.parse(event.data);
      if (frame.type === "hello") {
        hello = true;
        clearTimeout(helloTimer);
        this.attempt = 0;
        this.wsFailures = 0;
        this.acceptCursor(frame.cursor, frame.recovered);
        this.liveWs = ws;
        // a receipt sent on the last socket may have died with it: say the newest ones again
        this.ackedUpto = null;
        this.readsSent.clear();
        this.setStatus("live");
        this.acceptUnread(frame.unread);
        this.scheduleReceipts(); // what waited for a live socket
        this.flushWatch(); // a new socket watches nobody until told
      } else if (frame.type === "error") { // a refused ack or read marker: the socket stays open
        this.dispatchEvent(new CustomEvent("refusal", { detail: frame }));
      } else if (typeof frame.id === "string") {
        this.acceptFrame(frame);
      } else {
        this.acceptSignal(frame);
      }
    };
    ws.onclose = (event) => {
      clearTimeout(helloTimer);
      if (gen !== this.generation) return; // we closed it on purpose
      this.ws = null;
      this.liveWs = null;
      if (event?.code === TOKEN_EXPIRED || event?.code === UNAUTHORIZED) this.renew(gen);
      else if (event?.code === WRONG_PARTITION) this.wsWrongPartition(partitionOfClose(event.reason), gen);
      else {
        // The next connect first asks where the user is: its slot may have moved.
        if (event?.code === RESTARTING && this.partition !== null) this.askRoute = true;
        if (!hello) this.wsRefused(gen);
        else this.retryLater(); // 1012, 4008, 1011, a dropped network: resume with since
      }
    };
  }

  // Closed with 4421 after the auth frame (before any hello): told where the user is.
  async wsWrongPartition(told, gen) {
    if (!(await this.followRefusal(told, gen))) this.wsFailed(gen);
  }

  // The token expired (the daemon closed with 4001, or a poll was answered 401):
  // ask the app for a new one and resume at once with since, losing nothing.
  // Without renewToken the page hears "token-expired" and the client retries as usual.
  async renew(gen) {
    if (!this.renewToken) {
      this.dispatchEvent(new CustomEvent("token-expired"));
      this.retryLater();
      return;
    }
    try {
      this.token = await this.renewToken();
    } catch {
      if (gen === this.generation) this.retryLater();
      return;
    }
    if (gen !== this.generation || !this.running || this.offline) return;
    this.attempt = 0;
    this.connect();
  }

  async wsRefused(gen) {
    const told = this.partition !== null && this.fetchImpl ? await this.askPartition() : null;
    // Not refused for the partition (the poll said no 421): a daemon down, full or draining.
    if (told === null || !(await this.followRefusal(told, gen))) this.wsFailed(gen);
  }

  wsFailed(gen) {
    if (gen !== this.generation) return;
    this.wsFailures += 1;
    // From the Nth failure on, each failed attempt starts another period of polling.
    if (this.wsFailures >= this.wsFailuresBeforePoll) this.pollSince = Date.now();
    this.retryLater();
  }

  async connectPoll() {
    const gen = ++this.generation;
    this.transport = "poll";
    this.setStatus("polling");
    const abort = new AbortController();
    this.pollAbort = abort;
    // The token in Authorization, not the URL: the browser asks the daemon first (a CORS
    // preflight, which it then caches for the 600 s the daemon allows).
    // No timeout by default: the daemon then waits 25 s, or its cap if that is lower
    // (CHAT_POLL_MAX_TIMEOUT_SECONDS). Asking for 25 got a 422 from a daemon capped lower.
    const wait = this.pollTimeoutSeconds === null ? {} : { timeout: String(this.pollTimeoutSeconds) };
    const url = this.withSince(this.pollUrl, wait);
    this.askPresence(); // no `watch` without a socket: ask the API now and then
    try {
      const reply = await this.fetchImpl(url, this.pollInit(abort));
      if (reply.status === 401) {
        if (gen === this.generation) this.renew(gen);
        return;
      }
      if (reply.status === 421 && await this.followRefusal(await partitionOf(reply), gen)) return;
      if (!reply.ok) throw new Error(`poll answered ${reply.status}`);
      const page = await reply.json();
      if (gen !== this.generation) return;
      this.attempt = 0;
      if (this.since !== null && !page.recovered) this.startOver();
      for (const frame of page.messages) this.acceptFrame(frame);
      for (const signal of page.signals ?? []) this.acceptSignal(signal); // what came while it waited
      this.since = page.cursor; // covers everything in the answer, and the quiet time after it
      this.acceptUnread(page.unread);
      this.scheduleReceipts(); // also what waited for a WebSocket that never came back
    } catch {
      if (gen !== this.generation) return;
      this.retryLater();
      return;
    }
    this.pollAbort = null;
    this.connect(); // next poll at once, or the WebSocket again once wsRetryFromPollMs has passed
  }

  // ---- receipts: acks and read markers --------------------------------------------

  // This device has the stream's messages up to `id`. Acks name messages (an event's id
  // is no message), and only ever move forward.
  received(id) {
    if (this.ackUpto === null || compareIds(id, this.ackUpto) > 0) this.ackUpto = id;
    this.scheduleReceipts();
  }

  // I have read my conversation with `peer` up to their message `upto` (the page calls
  // this for the newest message it shows of an open conversation).
  markRead(peer, upto) {
    const known = this.reads.get(peer) ?? this.readsSent.get(peer);
    if (known !== undefined && compareIds(upto, known) <= 0) return;
    this.reads.set(peer, upto);
    this.scheduleReceipts();
  }

  hasReceipts() {
    return this.reads.size > 0 || (this.ackUpto !== null && this.ackUpto !== this.ackedUpto);
  }

  // One flush a little after the first news, then at most one per receiptIntervalMs
  // while news keeps coming: what came meanwhile replaces what waited.
  scheduleReceipts() {
    if (this.receiptTimer !== null || this.receiptsBusy || !this.running || !this.hasReceipts()) return;
    const wait = Math.max(this.receiptDelayMs, this.lastReceiptsAt + this.receiptIntervalMs - Date.now());
    this.receiptTimer = setTimeout(() => {
      this.receiptTimer = null;
      this.flushReceipts();
    }, wait);
  }

  async flushReceipts() {
    if (!this.running || !this.hasReceipts()) return;
    if (this.liveWs) {
      this.lastReceiptsAt = Date.now();
      const ws = this.liveWs;
      let frames = RECEIPT_FRAMES_PER_FLUSH;
      try {
        if (this.ackUpto !== null && this.ackUpto !== this.ackedUpto) {
          ws.send(JSON.stringify({ type: "ack", upto: this.ackUpto }));
          this.ackedUpto = this.ackUpto;
          frames -= 1;
        }
        for (const [peer, upto] of this.reads) {
          if (frames-- <= 0) break;
          ws.send(JSON.stringify({ type: "read", peer, upto }));
          this.reads.delete(peer);
          this.readsSent.set(peer, upto);
        }
      } catch { /* closing: what is left goes after the next hello */ }
      this.scheduleReceipts(); // what did not fit in this flush
      return;
    }
    if (this.transport !== "poll" || !this.fetchImpl) return; // the WebSocket's hello flushes them
    this.receiptsBusy = true;
    this.lastReceiptsAt = Date.now();
    try {
      if (this.ackUpto !== null && this.ackUpto !== this.ackedUpto) {
        const upto = this.ackUpto;
        const body = this.device ? { upto, device: this.device } : { upto };
        if (await this.postReceipt("/v1/acks", body)) this.ackedUpto = upto;
      }
      for (const [peer, upto] of [...this.reads]) {
        if (await this.postReceipt("/v1/read", { peer, upto })) {
          this.readsSent.set(peer, upto);
          if (this.reads.get(peer) === upto) this.reads.delete(peer);
        }
      }
    } finally {
      this.receiptsBusy = false;
    }
    this.scheduleReceipts(); // newer news, or a retry of what failed
  }

  // True once the API has it, or refused it for good (a 4xx: resending cannot help).
  async postReceipt(path, body) {
    try {
      const reply = await this.fetchImpl(`${this.apiUrl}${path}`, {
        method: "POST",
        headers: { "Content-Type": "application/json", Authorization: `Bearer ${this.token}` },
        body: JSON.stringify(body),
      });
      if (reply.ok) return true;
      if (reply.status !== 401 && reply.status !== 429 && reply.status < 500) { // 401: after the token's renewal
        const error = await reply.json().catch(() => ({ error: `http_${reply.status}` }));
        this.dispatchEvent(new CustomEvent("refusal", { detail: { ...error, code: error.error, path } }));
        return true;
      }
    } catch { /* network: retried at the next flush */ }
    return false;
  }

  // ---- signals: typing and presence (docs/presence.md) ------------------------------

  // A typing or presence frame (from the socket or a poll answer's `signals`): no id, no
  // position in the stream; passed to the page as it came.
  acceptSignal(frame) {
    if (frame?.type === "typing" || frame?.type === "presence") {
      this.dispatchEvent(new CustomEvent(frame.type, { detail: frame }));
    }
  }

  // I am typing to `peer` ("start"), or stopped ("stop"): a frame on the live socket, or
  // POST /v1/typing while long-polling. Otherwise dropped: a signal is never queued.
  typing(peer, state = "start") {
    if (!this.running) return;
    if (this.liveWs) {
      try {
        this.liveWs.send(JSON.stringify({ type: "typing", to: peer, state }));
      } catch { /* closing: dropped */ }
    } else if (this.transport === "poll" && this.fetchImpl) {
      this.fetchImpl(`${this.apiUrl}/v1/typing`, {
        method: "POST",
        headers: { "Content-Type": "application/json", Authorization: `Bearer ${this.token}` },
        body: JSON.stringify({ to: peer, state }),
      }).catch(() => { /* a signal: not retried */ });
    }
  }

  // The users whose presence the page wants: the daemon sends a snapshot of them, then each
  // change. Said after each hello and whenever the list changes.
  watch(users) {
    const list = watchList(users);
    if (sameUsers(list, this.watching)) return;
    this.watching = list;
    this.scheduleWatch();
    if (this.transport === "poll") this.askPresence(true);
  }

  // At once, unless a `watch` went less than watchIntervalMs ago: then the newest list, then.
  scheduleWatch() {
    if (this.watchTimer !== null || !this.liveWs) return;
    const wait = this.lastWatchAt + this.watchIntervalMs - Date.now();
    if (wait <= 0) {
      this.flushWatch();
      return;
    }
    this.watchTimer = setTimeout(() => {
      this.watchTimer = null;
      this.flushWatch();
    }, wait);
  }

  flushWatch() {
    const ws = this.liveWs;
    if (!ws || !this.running) return;
    const sent = this.watchSentOn === ws ? this.watchSent : [];
    if (sameUsers(sent, this.watching)) return; // a new socket's list is empty already
    this.lastWatchAt = Date.now();
    try {
      ws.send(JSON.stringify({ type: "watch", users: this.watching }));
    } catch {
      return; // closing: the next hello sends it
    }
    this.watchSentOn = ws;
    this.watchSent = this.watching;
  }

  // Long-polling, no socket watches: GET /v1/presence says the same, asked when the list
  // changes (`force`) and at most every presencePollMs otherwise. A 404 (presence off) stops it.
  // `presenceAsking`: the last ask's promise, settled once its answer is applied.
  askPresence(force = false) {
    const users = this.watching;
    if (this.presenceOff || !this.fetchImpl || users.length === 0) return;
    if (!force && Date.now() - this.presenceAskedAt < this.presencePollMs) return;
    this.presenceAskedAt = Date.now();
    this.presenceAsking = this.fetchPresence(users);
  }

  async fetchPresence(users) {
    try {
      const reply = await this.fetchImpl(`${this.apiUrl}/v1/presence?${new URLSearchParams({ users: users.join(",") })}`,
                                         { cache: "no-store", headers: { Authorization: `Bearer ${this.token}` } });
      if (reply.status === 404) this.presenceOff = true;
      if (!reply.ok) return;
      const answer = await reply.json();
      if (Array.isArray(answer?.users)) this.acceptSignal({ type: "presence", users: answer.users });
    } catch { /* asked again later */ }
  }

  // ---- sending -------------------------------------------------------------------

  // Logging out: what is still unsent is dropped, here and in storage (a shared
  // computer keeps no trace of it). Closing or reloading the tab keeps it.
  discardOutbox() {
    for (const saved of this.stored.saved()) this.stored.forget(saved);
    for (const entry of this.outbox.values()) this.stored.forget(entry);
  }

  // Posts once per client_msg_id; retries network errors, 429 and 5xx with backoff and
  // the same id, so a message typed offline is stored exactly once. Resolves with the
  // stored message, or rejects on a refusal that a retry cannot fix (4xx).
  send(to, body, clientMsgId = globalThis.crypto.randomUUID()) {
    const entry = { clientMsgId, to, body, state: null, message: null, waiting: false, wake: () => {} };
    this.outbox.set(clientMsgId, entry);
    this.stored.keep(entry);
    this.advance(entry, "sending");
    entry.done = this.deliver(entry);
    return entry;
  }

  async deliver(entry) {
    for (let attempt = 1; ; attempt++) {
      let retryAfterMs = 0;
      try {
        // ?partition=k: the proxy's route to the partition's leading API (the API ignores it). A
        // retry goes to any API: the leader may be the host that cannot store (its MySQL away).
        const route = this.partition === null || attempt > 1 ? "" : `?partition=${this.partition}`;
        const reply = await this.fetchImpl(`${this.apiUrl}/v1/messages${route}`, {
          method: "POST",
          headers: { "Content-Type": "application/json", Authorization: `Bearer ${this.token}` },
          body: JSON.stringify({ to: entry.to, body: entry.body, client_msg_id: entry.clientMsgId }),
        });
        if (reply.status === 200 || reply.status === 201) {
          const message = await reply.json();
          this.advance(entry, "stored", message);
          return message;
        }
        if (reply.status !== 429 && reply.status < 500) {
          const error = await reply.json().catch(() => ({ error: `http_${reply.status}` }));
          this.advance(entry, "failed", null, error);
          throw Object.assign(new Error(error.message || error.error), { reply: error });
        }
        retryAfterMs = 1000 * Number(reply.headers.get("Retry-After") || 0);
      } catch (err) {
        if (err.reply) throw err; // a refusal, not a network error
      }
      this.advance(entry, "retrying");
      const delay = Math.max(retryAfterMs, backoffDelay(attempt, this.backoffBaseMs, this.backoffMaxMs));
      await new Promise((resolve) => {
        entry.waiting = true;
        const timer = setTimeout(resolve, this.offline ? this.offlineRetryMs : delay);
        entry.wake = () => { clearTimeout(timer); resolve(); };
      });
      entry.waiting = false;
      if (this.stopped) {
        this.outbox.delete(entry.clientMsgId);
        throw new Error("client stopped; the message waits in storage for the next start");
      }
    }
  }

  advance(entry, state, message = null, error = null) {
    if (message) entry.message = message;
    if (entry.state === "echoed" || entry.state === "failed") return;
    if (state !== "failed" && STATES.indexOf(state) <= STATES.indexOf(entry.state)) return;
    entry.state = state;
    this.dispatchEvent(new CustomEvent("outbox", {
      detail: { clientMsgId: entry.clientMsgId, to: entry.to, body: entry.body, state, message: entry.message, error },
    }));
    if (state !== "sending" && state !== "retrying") this.stored.forget(entry); // stored, or refused for good
    if (state === "echoed" || state === "failed") this.outbox.delete(entry.clientMsgId);
  }
}
