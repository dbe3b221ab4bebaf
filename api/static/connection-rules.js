// The web client's pure rules of connection (chat-client.js): backoff, dedup, id order, the partition
// a daemon's 421 or the API names, and which of them to follow. No I/O of their own.

export function backoffDelay(attempt, baseMs, maxMs, random = Math.random) {
  // Full jitter: uniform in [cap/2, cap] so that reconnecting clients spread out.
  const cap = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt - 1));
  return cap / 2 + random() * (cap / 2);
}

// Remembers the last `limit` ids seen, so a repeat is dropped however it comes back.
export class SeenIds {
  constructor(limit = 10000) {
    this.limit = limit;
    this.ids = new Set();
  }

  add(id) {
    if (this.ids.has(id)) return false;
    this.ids.add(id);
    if (this.ids.size > this.limit) this.ids.delete(this.ids.values().next().value);
    return true;
  }
}

const WRONG_PARTITION = 421; // a daemon's answer to a user of a partition it does not serve

// The user's partition that a 421 `wrong_partition` answer names, else null.
export async function partitionOf(reply) {
  if (reply?.status !== WRONG_PARTITION) return null;
  const body = await reply.json().catch(() => null);
  return Number.isInteger(body?.partition) && body.partition >= 0 ? body.partition : null;
}

// The user's partition that a 4421 close's reason names (`{"partition": k}`), else null.
export function partitionOfClose(reason) {
  let body = null;
  try {
    body = JSON.parse(reason);
  } catch {
    return null;
  }
  return Number.isInteger(body?.partition) && body.partition >= 0 ? body.partition : null;
}

// The user's partition from a `GET /v1/client-config` answer (asked with the user's token), else null.
export async function partitionOfConfig(reply) {
  if (!reply?.ok) return null;
  const body = await reply.json().catch(() => null);
  return Number.isInteger(body?.partition) && body.partition >= 0 ? body.partition : null;
}

// Where to route next, refused with a 421 or closed with 1012 while routed to `route`: the
// API's answer (`fromApi`), else the refusal's (`fromRefusal`), whichever first names another
// partition than the one that just failed; else `route` (the caller backs off as usual). The
// API first: it is what the page asked at start, and after a slot move a daemon still on the
// old map names the old partition. The refusal when the API has no other answer (it cannot
// be reached, or it still holds the old map while the daemons hold the new one).
export function nextRoute(route, fromApi, fromRefusal) {
  for (const told of [fromApi, fromRefusal]) {
    if (told !== null && told !== undefined && told !== route) return told;
  }
  return route;
}

// Stream ids are decimal strings, in order: compared as numbers of any length, with no arithmetic.
export function compareIds(a, b) {
  return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
}
