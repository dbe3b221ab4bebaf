// The chat page: log in, list conversations with their unread counts, show one, send,
// edit and delete, see who is typing and who is online. Every text goes in with textContent,
// never innerHTML: a body is shown as the characters it is. Connection, resume, dedup, retries
// and receipts (acks, read markers) live in chat-client.js; docs/receipts.md is the contract.
// Typing and presence (docs/presence.md): their rules in signals.js, shown here.
import { ChatClient, compareIds } from "./chat-client.js";
import { PresenceBook, TypingIndicators, TypingSender, presenceText } from "./signals.js";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "chat.token"; // sessionStorage: one user per tab, so two tabs can be alice and bob
const HISTORY_PAGE = 50; // messages per GET /v1/messages page
const DEVICE_KEY = "chat.device"; // localStorage: one device id per browser, what its acks count for
// My message's label: pending (the outbox), then a tick that means what it says:
// sent = stored, delivered = a device of the peer has it, read = the peer read it.
const STATE_LABELS = {
  sending: "sending…", retrying: "retrying…", failed: "failed", sent: "sent", delivered: "delivered", read: "read",
};
const STATUS_LABELS = {
  idle: "idle", connecting: "connecting…", live: "live", reconnecting: "reconnecting…",
  polling: "polling", offline: "offline",
};

let config = null;
let client = null;
let me = null;
let token = null;
let openPeer = null;
const lastByPeer = new Map(); // peer -> newest message
const conversations = new Map(); // peer -> markers and unread count (see conv())
let amendments = new Map(); // message id -> its newest edit or delete event
let rowsById = new Map(); // message id -> <li>, in the open conversation
let shownById = new Map(); // message id -> the message as shown, in the open conversation
let rowsByClientId = new Map(); // client_msg_id -> <li>, my messages in the open conversation
let olderBefore = null; // the history cursor (next_before) of the open conversation, or null at its start
const typing = new TypingIndicators(); // who is typing to me, until when
const typingSender = new TypingSender(); // my typing, as the composer shows it
const presence = new PresenceBook(); // the watched users: online, or last seen when
let typingTimer = null; // when the next "typing…" ends
const PRESENCE_REFRESH_MS = 30000; // "last seen 5 min ago" is redrawn this often

// Ids are decimal strings in stream order (compareIds: no arithmetic). The newer of two, null-safe.
function newer(a, b) {
  if (a === null || a === undefined) return b ?? null;
  if (b === null || b === undefined) return a;
  return compareIds(a, b) >= 0 ? a : b;
}

function atOrBefore(id, upto) {
  return upto !== null && upto !== undefined && compareIds(id, upto) <= 0;
}

function peerOf(msg) {
  return msg.from === me ? msg.to : msg.from;
}

// This browser's device id (acks count per device): kept in localStorage, so every tab
// and every start of this browser is one device; a new one per page without storage.
function deviceId() {
  const fresh = `web-${crypto.randomUUID()}`;
  try {
    const saved = localStorage.getItem(DEVICE_KEY);
    if (saved && /^[A-Za-z0-9._-]{1,64}$/.test(saved)) return saved;
    localStorage.setItem(DEVICE_KEY, fresh);
  } catch { /* no storage: this page is a device of its own */ }
  return fresh;
}

function tokenUser(jwt) {
  const part = jwt.split(".")[1] || "";
  const b64 = part.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(part.length / 4) * 4, "=");
  return JSON.parse(atob(b64)).sub;
}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (token) headers.Authorization = `Bearer ${token}`;
  for (let attempt = 1; ; attempt++) {
    try {
      const reply = await fetch(path, { ...options, headers });
      if (reply.status < 500 || attempt >= 5) return reply;
    } catch (err) {
      if (attempt >= 5) throw err;
    }
    await new Promise((resolve) => setTimeout(resolve, 300 * attempt));
  }
}

// ---- login -----------------------------------------------------------------------------

function showLogin(error = "") {
  $("chat").hidden = true;
  $("login").hidden = false;
  $("dev-login").hidden = !config.dev_login;
  $("login-error").textContent = error;
}

async function devLogin(event) {
  event.preventDefault();
  const reply = await api("/v1/dev/token", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ user: $("dev-user").value.trim() }),
  });
  const answer = await reply.json();
  if (!reply.ok) return showLogin(answer.message || answer.error);
  await start(answer.token);
}

// A token from dev login is renewed the same way when it expires; the client then
// resumes with since, losing nothing.
async function renewDevToken(user) {
  const reply = await api("/v1/dev/token", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ user }),
  });
  if (!reply.ok) throw new Error(`dev login answered ${reply.status}`);
  token = (await reply.json()).token;
  sessionStorage.setItem(TOKEN_KEY, token);
  return token;
}

async function tokenLogin(event) {
  event.preventDefault();
  await start($("token").value.trim());
}

// The user's partition, which client-config names when asked with the user's token: the
// client routes its /v1/ws and /v1/poll there (?partition=k). Null if it cannot say; the
// client then learns it from the daemons' 421.
async function myPartition() {
  try {
    const reply = await api("/v1/client-config");
    const partition = reply.ok ? (await reply.json()).partition : null;
    return Number.isInteger(partition) ? partition : null;
  } catch {
    return null;
  }
}

async function start(jwt) {
  try {
    me = tokenUser(jwt);
  } catch {
    return showLogin("that is not a JWT");
  }
  token = jwt;
  const reply = await api("/v1/conversations");
  if (reply.status === 401) {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    return showLogin("the API refused this token");
  }
  sessionStorage.setItem(TOKEN_KEY, jwt);
  const list = (await reply.json()).conversations;

  // The client exists before any conversation can be opened: opening one reads its outbox.
  const transport = new URLSearchParams(location.search).get("transport") || "auto";
  const renewToken = config.dev_login ? () => renewDevToken(me) : null;
  const partition = await myPartition();
  client = new ChatClient({
    wsUrl: config.ws_url, pollUrl: config.poll_url, token, user: me, partition, transport, renewToken,
    device: deviceId(),
  });
  client.addEventListener("status", (e) => showStatus(e.detail));
  client.addEventListener("message", (e) => received(e.detail));
  client.addEventListener("event", (e) => applyEvent(e.detail));
  client.addEventListener("outbox", (e) => outboxChanged(e.detail));
  client.addEventListener("refusal", (e) => console.warn("refused:", e.detail));
  client.addEventListener("reset", () => reload());
  client.addEventListener("typing", (e) => { if (typing.apply(e.detail, me)) showTyping(); });
  client.addEventListener("presence", (e) => { if (presence.apply(e.detail).length) showPresence(); });
  client.addEventListener("token-expired", () => { // a pasted token: only its owner can get a new one
    client.stop(); // unsent messages stay stored, and go once the next login starts
    showLogin("the token expired: log in again");
  });
  window.chatApp.client = client;
  $("login").hidden = true;
  $("chat").hidden = false;
  $("me").textContent = me;
  showConversations(list);
  client.start();
  await Promise.all([loadDevices(), loadPresenceSetting()]);
}

function logout() {
  sendTyping(typingSender.stop());
  client?.discardOutbox();
  client?.stop();
  client = null;
  token = null;
  me = null;
  openPeer = null;
  lastByPeer.clear();
  conversations.clear();
  amendments = new Map();
  typing.clearAll();
  presence.clear();
  showTyping();
  showPresence();
  sessionStorage.removeItem(TOKEN_KEY);
  showDevices([], "");
  $("hide-presence-label").hidden = true;
  showLogin();
}

function showStatus(state) {
  $("status").dataset.state = state;
  $("status").textContent = STATUS_LABELS[state] || state;
  if (state === "live" || state === "polling") markOpenRead(); // a marker lost with a socket goes again
}

// ---- my presence: shown, or hidden (PUT /v1/presence/settings) -------------------------------

// The control shows only where presence is on (a 404 says it is off on this server).
async function loadPresenceSetting() {
  const user = me;
  let reply = null;
  try {
    reply = await api("/v1/presence/settings");
  } catch { /* no control */ }
  if (me !== user) return;
  $("hide-presence-label").hidden = !reply?.ok;
  if (reply?.ok) $("hide-presence").checked = (await reply.json()).hidden;
}

async function setPresenceHidden(hidden) {
  const box = $("hide-presence");
  box.disabled = true;
  try {
    const reply = await api("/v1/presence/settings", {
      method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ hidden }),
    });
    box.checked = reply.ok ? (await reply.json()).hidden : !hidden; // refused: as it was
  } catch {
    box.checked = !hidden;
  } finally {
    box.disabled = false;
  }
}

// ---- push devices ------------------------------------------------------------------------

// The devices the pusher notifies for me (GET /v1/devices): an app registers them with
// POST /v1/devices. This page registers none (docs/web-client.md): it lists them.
async function loadDevices() {
  const user = me;
  let reply = null;
  try {
    reply = await api("/v1/devices");
  } catch { /* shown below */ }
  if (me !== user) return; // logged out, or in as someone else, meanwhile
  if (!reply?.ok) return showDevices([], "devices unavailable");
  showDevices((await reply.json()).devices, "");
}

function showDevices(devices, problem) {
  $("devices").replaceChildren(...devices.map((d) => {
    const li = document.createElement("li");
    li.dataset.device = d.device;
    const name = document.createElement("span");
    name.className = "device";
    name.textContent = d.device;
    const platform = document.createElement("span");
    platform.className = "platform";
    platform.textContent = ` ${d.platform} · ${d.app_id}`;
    li.title = `registered ${d.created_at}`;
    li.append(name, platform);
    return li;
  }));
  $("devices-note").textContent = problem || (devices.length ? "" : "none registered");
}

// ---- conversations ----------------------------------------------------------------------

// What the page knows of one conversation. Unread = `unreadBase` (the API's count, exact up
// to `horizon`, the conversation's newest id when it was asked) + the messages from the
// peer that came after it above my marker (`unreadIds`): a message is counted once
// whichever way it came, and the count needs no history.
function conv(peer) {
  let c = conversations.get(peer);
  if (!c) {
    c = { unreadBase: 0, horizon: null, unreadIds: new Set(), readUpto: null, peerRead: null, peerDelivered: null };
    conversations.set(peer, c);
  }
  return c;
}

function unreadOf(peer) {
  const c = conv(peer);
  return c.unreadBase + c.unreadIds.size;
}

// GET /v1/conversations' answer, at the start or to count again.
function showConversations(list) {
  let newest = null;
  for (const { with: peer, last, unread, read_upto: readUpto, peer_read_upto: peerRead,
               peer_delivered_upto: peerDelivered } of list) {
    const c = conv(peer);
    c.unreadBase = Number.isInteger(unread) ? unread : 0;
    c.horizon = newer(c.horizon, last.id);
    for (const id of c.unreadIds) if (atOrBefore(id, c.horizon)) c.unreadIds.delete(id);
    c.readUpto = newer(c.readUpto, readUpto);
    c.peerRead = newer(c.peerRead, peerRead);
    c.peerDelivered = newer(c.peerDelivered, peerDelivered);
    if ((last.type ?? "message") === "message") {
      noteLast(peer, last);
      if (!last.deleted) newest = newer(newest, last.id);
    }
  }
  if (newest !== null) client?.received(newest); // this device has them: acknowledged
  renderConversations();
  refreshTicks();
  markOpenRead(); // the count of the conversation on screen may hold what its marker is on its way for
}

// A marker below the newest message counted by the API: only the API can say how many
// are left. Asked once for a burst of such markers.
let recount = null;
function recountSoon() {
  recount ??= (async () => {
    await new Promise((resolve) => setTimeout(resolve, 200));
    recount = null;
    const reply = await api("/v1/conversations");
    if (reply.ok && client) showConversations((await reply.json()).conversations);
  })().catch(() => { recount = null; });
}

function noteLast(peer, msg) {
  const known = lastByPeer.get(peer);
  if (!known || compareIds(known.id, msg.id) <= 0) lastByPeer.set(peer, amended(msg));
}

function renderConversations() {
  const items = [...lastByPeer.entries()].sort((a, b) => compareIds(b[1].id, a[1].id));
  let total = 0;
  $("conversations").replaceChildren(...items.map(([peer, last]) => {
    const li = document.createElement("li");
    li.dataset.peer = peer;
    li.classList.toggle("active", peer === openPeer);
    const name = document.createElement("span");
    name.className = "peer";
    name.textContent = peer;
    const unread = unreadOf(peer);
    total += unread;
    if (unread > 0) {
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.textContent = String(unread);
      li.append(badge);
    }
    const preview = document.createElement("span");
    preview.className = "preview";
    preview.classList.toggle("tombstone", Boolean(last.deleted));
    preview.textContent = (last.from === me ? "you: " : "") + (last.deleted ? "message deleted" : last.body);
    li.append(name, presenceMark(peer), preview);
    li.addEventListener("click", () => openConversation(peer));
    return li;
  }));
  $("unread-total").textContent = `${total} unread`;
  $("unread-total").hidden = total === 0;
  watchPeers(items.map(([peer]) => peer));
}

// ---- typing and presence (docs/presence.md) ------------------------------------------------

// The peers whose presence this page shows: the open conversation's, then the list's, newest
// first. The client sends them (at most 200) after each hello and whenever they change.
function watchPeers(listed) {
  client?.watch(openPeer ? [openPeer, ...listed] : listed);
}

// A conversation's mark in the list: a dot when the peer is online, else when they were last seen.
function presenceMark(peer) {
  const mark = document.createElement("span");
  const state = presence.get(peer);
  const text = presenceText(state);
  mark.className = "presence";
  mark.dataset.state = state?.online ? "online" : text ? "offline" : "unknown";
  mark.textContent = state?.online ? "" : text;
  mark.title = text;
  if (state?.online) mark.setAttribute("aria-label", "online");
  return mark;
}

// The open peer's presence under the title, and the marks in the list.
function showPresence() {
  const state = openPeer ? presence.get(openPeer) : null;
  const text = presenceText(state);
  $("presence").textContent = text;
  $("presence").dataset.state = state?.online ? "online" : text ? "offline" : "unknown";
  renderConversations();
}

// "typing…" while the open conversation's peer types to me; looked at again when it ends.
function showTyping() {
  $("typing").hidden = !(openPeer && typing.isTyping(openPeer));
  clearTimeout(typingTimer);
  const next = typing.nextChangeIn();
  typingTimer = next === null ? null : setTimeout(showTyping, next);
}

function sendTyping(frames) {
  for (const frame of frames) client?.typing(frame.to, frame.state);
}

function composerInput() {
  if (openPeer) sendTyping(typingSender.input(openPeer, $("body").value));
}

async function openConversation(peer) {
  if (peer !== openPeer) sendTyping(typingSender.stop()); // I leave that conversation
  openPeer = peer;
  rowsById = new Map();
  shownById = new Map();
  rowsByClientId = new Map();
  $("messages").replaceChildren();
  $("title").textContent = peer;
  $("composer").hidden = false;
  showTyping();
  showPresence(); // and the list, which watches the new peer too
  for (const entry of client.outbox.values()) {
    if (entry.to === peer) outboxChanged({ ...entry, message: entry.message });
  }
  showOlder(null);
  await loadHistory(peer, null);
  $("body").focus();
}

// One page of history, newest first from the API, placed by id: live frames that came
// meanwhile keep their rows. `next_before` says whether older messages exist.
async function loadHistory(peer, before) {
  const query = new URLSearchParams({ with: peer, limit: String(HISTORY_PAGE) });
  if (before !== null) query.set("before", before);
  const reply = await api(`/v1/messages?${query}`);
  if (!reply.ok || openPeer !== peer) return;
  const { messages, next_before: next } = await reply.json();
  for (const msg of messages) {
    if ((msg.type ?? "message") === "message") place(msg, false); // place() orders rows by id
  }
  // the first page shows the newest message, an older page its oldest one
  const edge = before === null ? $("messages").lastElementChild : $("messages").firstElementChild;
  edge?.scrollIntoView({ block: before === null ? "nearest" : "start" });
  showOlder(next);
  markOpenRead();
}

function showOlder(next) {
  olderBefore = next;
  $("older").hidden = next === null;
}

async function loadOlder() {
  if (!openPeer || olderBefore === null) return;
  const button = $("older");
  button.disabled = true; // one page at a time
  try {
    await loadHistory(openPeer, olderBefore);
  } finally {
    button.disabled = false;
  }
}

async function reload() {
  // The daemon could not resume us (retention passed, or an unknown since): ask the API.
  // The ids of before may name other messages now (a slot move): forget what they said.
  conversations.clear();
  amendments = new Map();
  const reply = await api("/v1/conversations");
  if (reply.ok) showConversations((await reply.json()).conversations);
  if (openPeer) await openConversation(openPeer);
}

// ---- read markers -----------------------------------------------------------------------

function reading(peer) {
  return peer === openPeer && document.visibilityState === "visible";
}

// The open conversation, on screen: I have read it up to the newest message of the peer
// it shows. The client sends that marker (coalesced); the `read` event it makes comes
// back on the stream, here and on my other devices, where it clears the count.
function markOpenRead() {
  if (!client || !openPeer || !reading(openPeer)) return;
  let newest = null;
  for (const msg of shownById.values()) {
    if (msg.from === openPeer && !msg.deleted) newest = newer(newest, msg.id);
  }
  const c = conv(openPeer);
  if (newest === null || atOrBefore(newest, c.readUpto)) return;
  client.markRead(openPeer, newest);
  if (dropUnreadUpto(c, newest)) renderConversations(); // shown already: no need to wait for the event
}

// The messages up to `upto` are read. False when the API's count may hold newer ones.
function dropUnreadUpto(c, upto) {
  for (const id of c.unreadIds) if (atOrBefore(id, upto)) c.unreadIds.delete(id);
  if (c.unreadBase > 0 && (c.horizon === null || atOrBefore(c.horizon, upto))) c.unreadBase = 0;
  return c.unreadBase === 0;
}

// My marker moved (here, or on another device of mine).
function readUpTo(peer, upto) {
  const c = conv(peer);
  c.readUpto = newer(c.readUpto, upto);
  if (!dropUnreadUpto(c, c.readUpto)) recountSoon();
  renderConversations();
}

// ---- messages and events ----------------------------------------------------------------

function received(msg) {
  const peer = peerOf(msg);
  if (msg.from === peer && typing.clear(peer)) showTyping(); // what they typed is here
  noteLast(peer, msg);
  const c = conv(peer);
  if (msg.from !== me && !msg.deleted && !reading(peer)
      && !atOrBefore(msg.id, c.readUpto) && !atOrBefore(msg.id, c.horizon)) {
    c.unreadIds.add(msg.id);
  }
  renderConversations();
  if (peer === openPeer) {
    place(msg);
    markOpenRead();
  }
}

function applyEvent(event) {
  const peer = peerOf(event);
  const c = conv(peer);
  if (event.type === "edit" || event.type === "delete") {
    amend(event);
  } else if (event.type === "read" && event.from === me) {
    readUpTo(peer, event.upto); // read here or on another device of mine
  } else if (event.type === "read") {
    c.peerRead = newer(c.peerRead, event.upto);
    refreshTicks();
  } else if (event.type === "delivered" && event.from !== me) { // mine: my devices' acks of their messages
    c.peerDelivered = newer(c.peerDelivered, event.upto);
    refreshTicks();
  }
}

// An edit or a delete of message `ref`: the newest one wins, a delete for good. Kept
// for messages not shown yet: their history may come older than the event.
function amend(event) {
  const known = amendments.get(event.ref);
  if (known && (known.type === "delete" || compareIds(known.id, event.id) >= 0)) return;
  amendments.set(event.ref, event);
  const peer = peerOf(event);
  const c = conv(peer);
  if (event.type === "delete" && event.from === peer) { // a message to me, gone: no longer unread
    if (c.unreadIds.has(event.ref)) c.unreadIds.delete(event.ref);
    else if (c.unreadBase > 0 && atOrBefore(event.ref, c.horizon) && !atOrBefore(event.ref, c.readUpto)) {
      recountSoon(); // counted by the API, perhaps before the delete: ask again
    }
  }
  const last = lastByPeer.get(peer);
  if (last?.id === event.ref) lastByPeer.set(peer, amended(last));
  renderConversations();
  const shown = shownById.get(event.ref);
  if (shown && peer === openPeer) place(shown, false);
}

// The message as its newest edit or delete left it. A newer version (history read
// after an edit whose event is still on its way) is kept.
function amended(msg) {
  const event = amendments.get(msg.id);
  if (!event || msg.deleted) return msg;
  if (event.type === "delete") return { ...msg, body: "", deleted: true };
  if (msg.edited_at && msg.edited_at >= event.created_at) return msg;
  return { ...msg, body: event.body, edited_at: event.created_at };
}

// My stored message's tick, from the peer's markers in this conversation.
function tickOf(msg) {
  const c = conv(peerOf(msg));
  if (atOrBefore(msg.id, c.peerRead)) return "read";
  if (atOrBefore(msg.id, c.peerDelivered)) return "delivered";
  return "sent";
}

function refreshTicks() {
  for (const [id, msg] of shownById) {
    if (msg.from !== me || msg.deleted) continue;
    const li = rowsById.get(id);
    const tick = tickOf(msg);
    if (li.dataset.state === tick) continue;
    li.dataset.state = tick;
    li.querySelector(".state").textContent = STATE_LABELS[tick];
  }
}

function outboxChanged({ clientMsgId, to, body, state, message }) {
  if (message) {
    noteLast(to, message);
    renderConversations();
  }
  if (to !== openPeer) return;
  if (message) {
    place(message);
    return;
  }
  let li = rowsByClientId.get(clientMsgId);
  if (!li) {
    li = document.createElement("li");
    rowsByClientId.set(clientMsgId, li);
    $("messages").append(li); // not stored yet: after everything that is
  }
  render(li, { from: me, body }, state);
}

// One row per message id, ordered by id; my pending messages wait at the end.
function place(message, scroll = true) {
  const msg = amended(message);
  let li = rowsById.get(msg.id) || (msg.from === me && rowsByClientId.get(msg.client_msg_id));
  const known = Boolean(li && li.dataset.id);
  if (!li) li = document.createElement("li");
  if (!known) {
    li.dataset.id = msg.id;
    rowsById.set(msg.id, li);
    const later = [...$("messages").children].find(
      (row) => row !== li && (!row.dataset.id || compareIds(row.dataset.id, msg.id) > 0));
    $("messages").insertBefore(li, later || null);
  }
  const shown = shownById.get(msg.id);
  const kept = shown && (shown.deleted || (shown.edited_at && !(msg.edited_at >= shown.edited_at))) ? shown : msg;
  shownById.set(msg.id, kept);
  render(li, kept, null);
  if (scroll) li.scrollIntoView({ block: "nearest" });
}

// A row: the body (or the tombstone), "edited", my tick or pending state, and for my
// stored messages the edit and delete buttons. `pending` is the outbox's state, or null.
function render(li, msg, pending) {
  const mine = msg.from === me;
  li.className = mine ? "message mine" : "message";
  li.classList.toggle("deleted", Boolean(msg.deleted));
  const state = pending ?? (mine && !msg.deleted ? tickOf(msg) : "");
  li.dataset.state = state;
  const parts = [];
  if (li.editor && !msg.deleted) {
    parts.push(li.editor); // being edited: the input stays as typed
  } else {
    li.editor = null;
    const body = document.createElement("span");
    body.className = msg.deleted ? "body tombstone" : "body";
    body.textContent = msg.deleted ? "message deleted" : msg.body;
    parts.push(body);
  }
  const meta = document.createElement("span");
  meta.className = "meta";
  if (msg.edited_at && !msg.deleted) {
    const edited = document.createElement("span");
    edited.className = "edited";
    edited.textContent = "edited";
    meta.append(edited);
  }
  const status = document.createElement("span");
  status.className = "state";
  status.textContent = mine ? STATE_LABELS[state] || state : "";
  meta.append(status);
  parts.push(meta);
  if (mine && pending === null && !msg.deleted && !li.editor) {
    const actions = document.createElement("span");
    actions.className = "actions";
    actions.append(button("Edit", "edit", () => startEdit(li, msg)),
                   button("Delete", "delete", () => remove(li, msg)));
    parts.push(actions);
  }
  if (li.problem) {
    const problem = document.createElement("span");
    problem.className = "error";
    problem.textContent = li.problem;
    parts.push(problem);
  }
  li.replaceChildren(...parts);
}

function button(text, className, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = className;
  b.textContent = text;
  b.addEventListener("click", onClick);
  return b;
}

// ---- edit and delete (my messages) --------------------------------------------------------

function startEdit(li, msg) {
  const form = document.createElement("form");
  form.className = "editor";
  const input = document.createElement("input");
  input.className = "edit-body";
  input.value = msg.body;
  input.required = true;
  input.setAttribute("aria-label", "edit message");
  form.append(input, button("Cancel", "cancel", () => stopEdit(li)));
  const save = document.createElement("button");
  save.type = "submit";
  save.textContent = "Save";
  form.insertBefore(save, form.lastChild);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (input.value && input.value !== msg.body) saveEdit(li, msg, input.value);
    else stopEdit(li);
  });
  input.addEventListener("keydown", (event) => { if (event.key === "Escape") stopEdit(li); });
  li.editor = form;
  li.problem = null;
  render(li, shownById.get(msg.id) ?? msg, null);
  input.focus();
}

function stopEdit(li) {
  li.editor = null;
  const msg = shownById.get(li.dataset.id);
  if (msg) render(li, msg, null);
}

// PATCH and DELETE carry a client_msg_id, so api()'s retries of a 5xx are applied once.
// The answer is the event, applied at once; its copy on the stream changes nothing then.
async function saveEdit(li, msg, body) {
  stopEdit(li);
  await amendOnServer(li, "PATCH", `/v1/messages/${encodeURIComponent(msg.id)}`,
                      { body, client_msg_id: crypto.randomUUID() });
}

async function remove(li, msg) {
  const query = new URLSearchParams({ client_msg_id: crypto.randomUUID() });
  await amendOnServer(li, "DELETE", `/v1/messages/${encodeURIComponent(msg.id)}?${query}`, null);
}

async function amendOnServer(li, method, path, body) {
  li.problem = null;
  let reply;
  try {
    reply = await api(path, body === null ? { method } : {
      method, headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
  } catch {
    reply = null;
  }
  const answer = reply ? await reply.json().catch(() => ({})) : {};
  if (reply?.ok) {
    amend(answer);
    return;
  }
  li.problem = `${method === "PATCH" ? "edit" : "delete"} refused: ${answer.message || answer.error || "no answer"}`;
  const shown = shownById.get(li.dataset.id);
  if (shown) render(li, shown, null);
}

function send(event) {
  event.preventDefault();
  const text = $("body").value;
  if (!text || !openPeer) return;
  $("body").value = "";
  sendTyping(typingSender.stop());
  client.send(openPeer, text).done.catch(() => {}); // "failed" is shown on the row
}

function openFromForm(event) {
  event.preventDefault();
  const peer = $("peer").value.trim();
  if (peer) openConversation(peer);
  $("peer").value = "";
}

async function main() {
  window.chatApp = { client: null, openConversation };
  document.addEventListener("visibilitychange", markOpenRead);
  window.addEventListener("focus", markOpenRead);
  $("dev-login").addEventListener("submit", devLogin);
  $("token-login").addEventListener("submit", tokenLogin);
  $("logout").addEventListener("click", logout);
  $("hide-presence").addEventListener("change", (e) => setPresenceHidden(e.target.checked));
  $("open-chat").addEventListener("submit", openFromForm);
  $("composer").addEventListener("submit", send);
  $("body").addEventListener("input", composerInput);
  setInterval(() => { if (client) showPresence(); }, PRESENCE_REFRESH_MS); // "last seen 5 min ago" ages
  $("older").addEventListener("click", loadOlder);
  $("devices-refresh").addEventListener("click", () => loadDevices());
  config = await (await api("/v1/client-config")).json();
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) await start(saved);
  else showLogin();
}

main();
