// The web client's outbox in `storage` (localStorage): one key per message not yet stored
// by the API, `chat.outbox.<user>.<client_msg_id>`, so two tabs never overwrite each other's.
// Storage can be missing, full or refused (private mode): the outbox then lives in memory
// only (chat-client.js), and sending still works.

export class StoredOutbox {
  constructor(storage, user) {
    this.storage = storage;
    this.prefix = `chat.outbox.${user}.`;
    this.seq = 0;
  }

  // What a reload or a closed tab left behind, in typed order.
  saved() {
    const saved = [];
    let keys = [];
    try {
      for (let i = 0; i < this.storage.length; i++) keys.push(this.storage.key(i));
    } catch { keys = []; /* no storage */ }
    for (const key of keys) {
      if (!key?.startsWith(this.prefix)) continue;
      try {
        const { to, body, at } = JSON.parse(this.storage.getItem(key));
        if (typeof to === "string" && typeof body === "string") {
          saved.push({ clientMsgId: key.slice(this.prefix.length), to, body, at: Number(at) || 0 });
        }
      } catch { /* not an entry of ours: skip it */ }
    }
    return saved.sort((a, b) => a.at - b.at);
  }

  keep(entry) {
    const key = this.prefix + entry.clientMsgId;
    try {
      if (this.storage.getItem(key) !== null) return; // resent after a reload: keep its place
      // `at` orders the outbox as typed, also for messages typed within one millisecond.
      this.seq += 1;
      const at = Date.now() * 1000 + (this.seq % 1000);
      this.storage.setItem(key, JSON.stringify({ to: entry.to, body: entry.body, at }));
    } catch { /* memory only */ }
  }

  forget(entry) {
    try { this.storage.removeItem(this.prefix + entry.clientMsgId); } catch { /* memory only */ }
  }
}
