// The web client's pure rules of typing and presence (docs/presence.md): signals, not messages,
// so nothing here has an id, a cursor or a place in the stream. No I/O and no timers of their
// own: the clock is injected (`now`, in ms), so the tests move it instead of waiting.

export const TYPING_REFRESH_MS = 2000; // a `start` at most this often while the user types
export const TYPING_TTL_DEFAULT_S = 5; // what a `typing` frame without a usable `ttl` lasts
export const WATCH_MAX = 200; // users one connection may watch (CHAT_PRESENCE_WATCH_MAX's default)
const USER_ID = /^[A-Za-z0-9_.-]{1,64}$/;

export function isUserId(value) {
  return typeof value === "string" && USER_ID.test(value);
}

// Who is typing to me, and until when. A `start` shows for its `ttl` from now unless another
// `start` refreshes it; a `stop`, or a message from that peer, ends it at once.
export class TypingIndicators {
  constructor(now = () => Date.now()) {
    this.now = now;
    this.until = new Map(); // peer -> when their indicator ends (ms)
  }

  // A `typing` frame from a daemon; the peer whose indicator changed, else null. Only frames to
  // `me` from someone else count: the server also sends mine to my other connections.
  apply(frame, me) {
    if (frame?.type !== "typing" || frame.to !== me || !isUserId(frame.from) || frame.from === me) return null;
    if (frame.state === "stop") return this.clear(frame.from) ? frame.from : null;
    const ttl = Number.isFinite(frame.ttl) && frame.ttl > 0 ? frame.ttl : TYPING_TTL_DEFAULT_S;
    this.until.set(frame.from, this.now() + ttl * 1000);
    return frame.from;
  }

  // Ends `peer`'s indicator (a message from them came); true if it was showing.
  clear(peer) {
    const showing = this.isTyping(peer);
    this.until.delete(peer);
    return showing;
  }

  clearAll() {
    this.until.clear();
  }

  isTyping(peer) {
    const end = this.until.get(peer);
    if (end === undefined) return false;
    if (this.now() < end) return true;
    this.until.delete(peer);
    return false;
  }

  // Milliseconds until the next indicator ends, or null when none shows: when to look again.
  nextChangeIn() {
    const now = this.now();
    let soonest = null;
    for (const [peer, end] of this.until) {
      if (end <= now) this.until.delete(peer);
      else if (soonest === null || end < soonest) soonest = end;
    }
    return soonest === null ? null : soonest - now;
  }
}

// What the composer says about my typing: a `start` on input at most every `refreshMs` (the
// peer's indicator lasts its ttl from each one), a `stop` when the composer is cleared, the
// message sent or the conversation left. Returns the frames to send; the client sends them.
export class TypingSender {
  constructor({ now = () => Date.now(), refreshMs = TYPING_REFRESH_MS } = {}) {
    this.now = now;
    this.refreshMs = refreshMs;
    this.peer = null; // whom my last `start` went to, until its `stop`
    this.lastStart = -Infinity;
  }

  // The composer's text is now `text`, in the conversation with `peer`.
  input(peer, text) {
    const frames = this.peer !== null && this.peer !== peer ? this.stop() : [];
    if (!text || !isUserId(peer)) return [...frames, ...this.stop()];
    const now = this.now();
    if (this.peer !== peer || now - this.lastStart >= this.refreshMs) {
      this.peer = peer;
      this.lastStart = now;
      frames.push({ type: "typing", to: peer, state: "start" });
    }
    return frames;
  }

  // A `stop` to whom a `start` went, else nothing.
  stop() {
    if (this.peer === null) return [];
    const frame = { type: "typing", to: this.peer, state: "stop" };
    this.peer = null;
    this.lastStart = -Infinity;
    return [frame];
  }
}

// The users a connection watches: user ids, each once, in the order given (the open
// conversation's peer first, then the newest conversations), at most `max`.
export function watchList(users, max = WATCH_MAX) {
  const list = [];
  const seen = new Set();
  for (const user of users) {
    if (list.length >= max) break;
    if (!isUserId(user) || seen.has(user)) continue;
    seen.add(user);
    list.push(user);
  }
  return list;
}

// Whether two watch lists (each without repeats) hold the same users, in any order: a list that
// only moved (a conversation went to the top) needs no new `watch`.
export function sameUsers(a, b) {
  if (a.length !== b.length) return false;
  const users = new Set(a);
  return b.every((user) => users.has(user));
}

// What the page knows of the users it watches: online, or offline since `last_seen` (null: never
// seen, or hidden). A snapshot (`users`) and each change (`user`) set the users they name.
export class PresenceBook {
  constructor() {
    this.users = new Map(); // user -> { online, last_seen }
  }

  // A `presence` frame (either shape), or GET /v1/presence's answer; the users it changed.
  apply(frame) {
    const entries = Array.isArray(frame?.users) ? frame.users : typeof frame?.user === "string" ? [frame] : [];
    const changed = [];
    for (const entry of entries) {
      if (!isUserId(entry?.user) || typeof entry.online !== "boolean") continue;
      const state = { online: entry.online, last_seen: entry.online ? null : entry.last_seen ?? null };
      const known = this.users.get(entry.user);
      if (known && known.online === state.online && known.last_seen === state.last_seen) continue;
      this.users.set(entry.user, state);
      changed.push(entry.user);
    }
    return changed;
  }

  get(user) {
    return this.users.get(user) ?? null;
  }

  clear() {
    this.users.clear();
  }
}

// How a user's presence reads: "online", "last seen 5 min ago", or "" (unknown, never seen, hidden).
export function presenceText(state, now = Date.now()) {
  if (!state) return "";
  if (state.online) return "online";
  const at = state.last_seen === null ? NaN : Date.parse(state.last_seen);
  if (Number.isNaN(at)) return "";
  const seconds = Math.max(0, (now - at) / 1000);
  if (seconds < 60) return "last seen just now";
  if (seconds < 3600) return `last seen ${Math.floor(seconds / 60)} min ago`;
  if (seconds < 86400) return `last seen ${Math.floor(seconds / 3600)} h ago`;
  return `last seen ${new Date(at).toISOString().slice(0, 10)}`;
}
