"""A reference Python client: reconnects with backoff and jitter, resumes with
``since``, drops repeats by id, follows its partition, renews an expired token.
The tests and the load generator use it.

The stream holds messages and events (edits, deletes, read markers, delivery
receipts: docs/receipts.md), each with an id of the same sequence: the client
resumes and drops repeats the same way for all of them. An ``error`` frame (a
refused ``ack`` or ``read``) is no part of the stream: it has no id, moves no
cursor, and is passed on as it comes; so are the signals (docs/presence.md:
``typing``, and ``presence`` for the users the client watches), which are never
resumed: a client that was away gets no old one.

Partitions (docs/decisions/partitioned-delivery.md): a daemon that does not
serve the user answers the handshake 421 with the user's partition; the
client connects again at once with ``?partition=k`` (the proxy's route to that
partition's daemons). It resumes with the last ``cursor`` it saw (a frame's
``cursor`` when it has one, else its id): ids are positions in one partition
only, and a cursor also says which partition and epoch it was made in. Given a
way to ask the API (``GET /v1/client-config`` with the user's token names the
user's partition), it also asks there on a 421, and follows the first of the
API's answer and the 421's that names another partition (``next_route``); and
after a 1012 (a daemon restarting, or closing the sockets of users whose slot
moved) it asks before it reconnects, after the usual backoff, so that a moved
user's device finds its new partition's daemons by itself.

Tokens: the daemon closes a socket with 4001 once its token's ``exp`` has
passed; the client mints a new one and reconnects at once. A token that
expired while the client was away (a daemon restart, a backoff) is refused at
the handshake with 401: the client mints a new one too, and backs off as after
any refusal, so that a secret that is wrong is not asked again and again.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import httpx
import orjson
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

TOKEN_EXPIRED = 4001  # the daemon's close once a socket's token passes its exp
RESTARTING = 1012  # the daemon's close when it restarts, or when the user's slot moved to other daemons
UNAUTHORIZED = 401  # the daemon's handshake answer to a token that is expired (or forged)
WRONG_PARTITION = 421


class Inbox:
    """What one client has received of its stream (messages and events): ids in arrival
    order, repeats counted, not kept."""

    def __init__(self, since: str | None = None, partition: int | None = None):
        self.since = since
        self.partition = partition  # the route (?partition=k), learned from a 421
        self.ids: list[int] = []
        self.seen: set[int] = set()
        self.duplicates = 0
        self.hellos: list[dict] = []

    def accept(self, frame: dict) -> bool:
        if frame.get("type") == "hello":
            self.hellos.append(frame)
            # Keep our own resume point while catch-up frames are still to come;
            # take the server's only when we had none, or ours could not be served
            # (then the app reloads history from the API).
            if self.since is None or not frame["recovered"]:
                if self.since is not None:
                    # The stream starts over at the server's cursor: every id from
                    # now on is new, and after a slot move they are another
                    # partition's ids, which may equal ids seen before.
                    self.seen.clear()
                self.since = frame["cursor"]
            return False
        if "id" not in frame:  # an `error` frame or a signal: not a position in the stream
            return True
        msg_id = int(frame["id"])
        if msg_id in self.seen:
            self.duplicates += 1
            return False
        self.seen.add(msg_id)
        self.ids.append(msg_id)
        self.since = frame.get("cursor", frame["id"])
        return True

    def query(self) -> str:
        """The /v1/ws query string that resumes this inbox. Never the token: a URL
        lands in proxies' error logs, so it goes in ``Authorization``."""
        parts = []
        if self.since:
            parts.append(f"since={quote(self.since)}")
        if self.partition is not None:
            parts.append(f"partition={self.partition}")
        return "&".join(parts)


def watch_frame(users: list[str]) -> str:
    """The ``watch`` frame for ``users``: it replaces what the connection watched (``[]``: nobody)."""
    return orjson.dumps({"type": "watch", "users": users}).decode()


def next_route(route: int | None, from_api: int | None, from_refusal: int | None) -> int | None:
    """Where to connect next, refused with a 421 or closed with 1012 while routed to ``route``:
    the API's answer, else the refusal's, whichever first names another partition than the one
    that just failed; else ``route`` (and the caller backs off as usual). The API first: after a
    slot move, a daemon still on the old map names the old partition. The refusal's when the API
    has no other answer (unreachable, or still on the old map while the daemons have the new)."""
    for told in (from_api, from_refusal):
        if told is not None and told != route:
            return told
    return route


def partition_of_config(status: int, body: bytes) -> int | None:
    """The user's partition from a ``GET /v1/client-config`` answer, else None."""
    if status != 200:
        return None
    try:
        partition = orjson.loads(body).get("partition")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return partition if isinstance(partition, int) and partition >= 0 else None


async def partition_from_api(api_url: str, token: str, timeout: float = 2.0,
                             transport: httpx.AsyncBaseTransport | None = None) -> int | None:
    """The user's partition as the API says it (``GET /v1/client-config`` with the user's token),
    or None when it does not answer within ``timeout`` seconds or names none."""
    try:
        async with httpx.AsyncClient(timeout=timeout, transport=transport) as client:
            reply = await client.get(f"{api_url}/v1/client-config", headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        return None
    return partition_of_config(reply.status_code, reply.content)


def partition_of_refusal(refused: InvalidStatus) -> int | None:
    """The user's partition from a 421 ``wrong_partition`` handshake answer, else None."""
    response = refused.response
    if response.status_code != WRONG_PARTITION:
        return None
    try:
        partition = orjson.loads(response.body)["partition"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return partition if isinstance(partition, int) and partition >= 0 else None


async def listen(base_url: str, token: str, since: str | None, on_message: Callable[[dict], None],
                 count: int | None = None, max_backoff: float = 5.0, inbox: Inbox | None = None,
                 renew: Callable[[str], str] | None = None,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 on_hello: Callable[[dict], None] | None = None, watch: list[str] | None = None,
                 ask_partition: Callable[[str], Awaitable[int | None]] | None = None,
                 on_route: Callable[[int | None, str], None] | None = None) -> Inbox:
    """Receives until ``count`` frames of the stream (messages and events), or forever; ``inbox``
    lets the caller watch progress. ``on_message`` gets each new one, each ``error`` frame and each
    signal (``typing``, ``presence``: they count for nothing in ``count``); ``on_hello`` each
    connection's hello. ``watch``: the users whose presence to follow, said after each hello (a new
    connection watches nobody).
    ``renew(why)``: a new token, when the daemon closes with 4001 (``why`` = "closed with 4001")
    or refuses the handshake with 401 ("refused with 401"); without it, the same one is tried again.
    ``sleep``: how it waits out a backoff.
    ``ask_partition(token)``: the user's partition as the API says it (``partition_from_api``), or
    None; asked on a 421 and before reconnecting after a 1012. ``on_route(partition, why)``: each
    change of the route (``?partition=``), and what told it ("the API" or "a 421")."""
    inbox = inbox or Inbox(since)
    attempt = 0
    ask_first = False  # closed with 1012: ask the API where the user is before the next connect

    async def reroute(from_refusal: int | None) -> bool:
        """Follows ``next_route``; True if the route changed."""
        from_api = await ask_partition(token) if ask_partition is not None else None
        route = next_route(inbox.partition, from_api, from_refusal)
        if route == inbox.partition:
            return False
        inbox.partition = route
        if on_route is not None:
            on_route(route, "the API" if route == from_api else "a 421")
        return True

    while count is None or len(inbox.ids) < count:
        if ask_first:
            ask_first = False
            await reroute(None)
        at_once = False
        try:
            async with websockets.connect(f"{base_url}/v1/ws?{inbox.query()}", max_size=2**20,
                                          additional_headers={"Authorization": f"Bearer {token}"}) as ws:
                attempt = 0
                async for raw in ws:
                    frame = orjson.loads(raw)
                    if inbox.accept(frame):
                        on_message(frame)
                        if count is not None and len(inbox.ids) >= count:
                            return inbox
                    elif frame.get("type") == "hello":
                        if on_hello is not None:
                            on_hello(frame)
                        if watch is not None:
                            await ws.send(watch_frame(watch))
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd is not None else None
            if code == TOKEN_EXPIRED and renew is not None:
                token, at_once = renew(f"closed with {TOKEN_EXPIRED}"), True
            elif code == RESTARTING:
                ask_first = True  # the user's slot may have moved: ask once the backoff has passed
        except InvalidStatus as refused:
            if refused.response.status_code == UNAUTHORIZED and renew is not None:
                token = renew(f"refused with {UNAUTHORIZED}")  # then back off: the secret may be what is wrong
            if refused.response.status_code == WRONG_PARTITION:
                # At once where the API or the 421 says, unless both name the route that failed (back off).
                at_once = await reroute(partition_of_refusal(refused))
        except (OSError, TimeoutError):
            pass
        if at_once:
            continue
        attempt += 1
        await sleep(min(max_backoff, 0.05 * 2 ** attempt) * random.uniform(0.5, 1))
    return inbox
