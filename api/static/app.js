// The chat page: log in, list conversations, show one, send. Every text goes in with
// textContent, never innerHTML: a body is shown as the characters it is.
// Connection, resume, dedup and retries live in chat-client.js.
import { ChatClient } from "./chat-client.js";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "chat.token"; // sessionStorage: one user per tab, so two tabs can be alice and bob
const HISTORY_PAGE = 50; // messages per GET /v1/messages page
const STATE_LABELS = {
  sending: "sending…", retrying: "retrying…", stored: "stored", delivered: "delivered", history: "stored",
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
let rowsById = new Map(); // message id -> <li>, in the open conversation
let rowsByClientId = new Map(); // client_msg_id -> <li>, my messages in the open conversation
let olderBefore = null; // the history cursor (next_before) of the open conversation, or null at its start

// Ids are decimal strings in stream order; the page compares them only to merge
// history with live frames. No arithmetic.
function compareIds(a, b) {
  return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
}

function peerOf(msg) {
  return msg.from === me ? msg.to : msg.from;
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
  const conversations = (await reply.json()).conversations;

  // The client exists before any conversation can be opened: opening one reads its outbox.
  const transport = new URLSearchParams(location.search).get("transport") || "auto";
  const renewToken = config.dev_login ? () => renewDevToken(me) : null;
  const partition = await myPartition();
  client = new ChatClient({
    wsUrl: config.ws_url, pollUrl: config.poll_url, token, user: me, partition, transport, renewToken,
  });
  client.addEventListener("status", (e) => showStatus(e.detail));
  client.addEventListener("message", (e) => received(e.detail));
  client.addEventListener("outbox", (e) => outboxChanged(e.detail));
  client.addEventListener("reset", () => reload());
  client.addEventListener("token-expired", () => { // a pasted token: only its owner can get a new one
    client.stop(); // unsent messages stay stored, and go once the next login starts
    showLogin("the token expired: log in again");
  });
  window.chatApp.client = client;
  $("login").hidden = true;
  $("chat").hidden = false;
  $("me").textContent = me;
  showConversations(conversations);
  client.start();
}

function logout() {
  client?.discardOutbox();
  client?.stop();
  client = null;
  token = null;
  me = null;
  openPeer = null;
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin();
}

function showStatus(state) {
  $("status").dataset.state = state;
  $("status").textContent = STATUS_LABELS[state] || state;
}

// ---- conversations ----------------------------------------------------------------------

function showConversations(list) {
  for (const { with: peer, last } of list) noteLast(peer, last);
  renderConversations();
}

function noteLast(peer, msg) {
  const known = lastByPeer.get(peer);
  if (!known || compareIds(known.id, msg.id) < 0) lastByPeer.set(peer, msg);
}

function renderConversations() {
  const items = [...lastByPeer.entries()].sort((a, b) => compareIds(b[1].id, a[1].id));
  $("conversations").replaceChildren(...items.map(([peer, last]) => {
    const li = document.createElement("li");
    li.dataset.peer = peer;
    li.classList.toggle("active", peer === openPeer);
    const name = document.createElement("span");
    name.className = "peer";
    name.textContent = peer;
    const preview = document.createElement("span");
    preview.className = "preview";
    preview.textContent = (last.from === me ? "you: " : "") + last.body;
    li.append(name, preview);
    li.addEventListener("click", () => openConversation(peer));
    return li;
  }));
}

async function openConversation(peer) {
  openPeer = peer;
  rowsById = new Map();
  rowsByClientId = new Map();
  $("messages").replaceChildren();
  $("title").textContent = peer;
  $("composer").hidden = false;
  renderConversations();
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
  for (const msg of messages) place(msg, "history", false); // place() orders rows by id
  // the first page shows the newest message, an older page its oldest one
  const edge = before === null ? $("messages").lastElementChild : $("messages").firstElementChild;
  edge?.scrollIntoView({ block: before === null ? "nearest" : "start" });
  showOlder(next);
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
  const reply = await api("/v1/conversations");
  if (reply.ok) showConversations((await reply.json()).conversations);
  if (openPeer) await openConversation(openPeer);
}

// ---- messages ---------------------------------------------------------------------------

function received(msg) {
  noteLast(peerOf(msg), msg);
  renderConversations();
  if (peerOf(msg) === openPeer) place(msg, "delivered");
}

function outboxChanged({ clientMsgId, to, body, state, message }) {
  if (message) {
    noteLast(to, message);
    renderConversations();
  }
  if (to !== openPeer) return;
  if (message) {
    place(message, state);
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
function place(msg, state, scroll = true) {
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
  const shown = li.dataset.state;
  if (!(shown === "delivered" && state !== "delivered")) render(li, msg, state);
  if (scroll) li.scrollIntoView({ block: "nearest" });
}

function render(li, msg, state) {
  const mine = msg.from === me;
  li.className = mine ? "message mine" : "message";
  li.dataset.state = state;
  const body = document.createElement("span");
  body.className = "body";
  body.textContent = msg.body;
  const status = document.createElement("span");
  status.className = "state";
  status.textContent = mine ? STATE_LABELS[state] || state : "";
  li.replaceChildren(body, status);
}

function send(event) {
  event.preventDefault();
  const text = $("body").value;
  if (!text || !openPeer) return;
  $("body").value = "";
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
  $("dev-login").addEventListener("submit", devLogin);
  $("token-login").addEventListener("submit", tokenLogin);
  $("logout").addEventListener("click", logout);
  $("open-chat").addEventListener("submit", openFromForm);
  $("composer").addEventListener("submit", send);
  $("older").addEventListener("click", loadOlder);
  config = await (await api("/v1/client-config")).json();
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) await start(saved);
  else showLogin();
}

main();
