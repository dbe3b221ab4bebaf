"""Typing and presence in Redis (docs/presence.md): the keys, the Lua scripts
that change them, and the channels they publish on. Used by the daemons and
the API processes of every host, which share one Redis.

Keys:
- ``chat:on:{user}``: the daemons holding a connection of the user (or in its grace);
- ``chat:du:{daemon}``: the users a daemon has put in those sets, for sweeping it once it is dead;
- ``chat:daemons``: each daemon's last heartbeat, a sorted set scored in Redis's own milliseconds;
- ``chat:hidden``: the users who hide their presence, a copy of MySQL's ``presence.hidden``,
  trusted only while ``chat:hidden:loaded`` exists (no change is published before that).

Each change is one script, so that the set turning empty or non-empty and the
publication of it are one step: a user connected to two hosts goes offline
once, when both are gone. Channel payloads are space-separated words (user
ids have no space): ``chat:presence:{user}`` carries ``1 user`` (online),
``0 user ms`` (offline, last seen at ``ms``) and ``0 user`` (offline, last
seen hidden); ``chat:typing:{p}`` carries ``origin from to state``. A channel
per user, not one for all: a daemon subscribes to the users its connections
watch, so a change is read by those daemons only (a million connects would
otherwise be a million changes read by every daemon).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript

PRESENCE_PREFIX = "chat:presence:"
DAEMONS = "chat:daemons"
HIDDEN = "chat:hidden"
HIDDEN_LOADED = "chat:hidden:loaded"
REDIS_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
SWEEP_BATCH = 500  # users one sweep script withdraws: a dead daemon's thousands never hold Redis long


def presence_channel(user: str) -> str:
    return PRESENCE_PREFIX + user


def typing_channel(partition: int) -> str:
    return f"chat:typing:{partition}"


def online_key(user: str) -> str:
    return f"chat:on:{user}"


def daemon_users_key(daemon: str) -> str:
    return f"chat:du:{daemon}"


# A publication, unless the hidden list is not loaded or the user is in it.
_PUBLISH_IF_SHOWN = """
local function publish_if_shown(user, payload)
  if redis.call('EXISTS', KEYS[4]) == 1 and redis.call('SISMEMBER', KEYS[3], user) == 0 then
    redis.call('PUBLISH', 'chat:presence:' .. user, payload)
  end
end
"""

# KEYS: on:{user}, du:{daemon}, hidden, hidden:loaded; ARGV: daemon, user. 1: the user came online.
ANNOUNCE = _PUBLISH_IF_SHOWN + """
local added = redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
if added == 1 and redis.call('SCARD', KEYS[1]) == 1 then
  publish_if_shown(ARGV[2], '1 ' .. ARGV[2])
  return 1
end
return 0
"""

# KEYS as ANNOUNCE; ARGV: daemon, user, last seen (ms). 1: the user went offline.
WITHDRAW = _PUBLISH_IF_SHOWN + """
local removed = redis.call('SREM', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[2], ARGV[2])
if removed == 1 and redis.call('SCARD', KEYS[1]) == 0 then
  publish_if_shown(ARGV[2], '0 ' .. ARGV[2] .. ' ' .. ARGV[3])
  return 1
end
return 0
"""

# KEYS: daemons; ARGV: daemon. {was it there (0/1), Redis's time in ms}.
HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local had = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], now, ARGV[1])
if had then return {1, now} end
return {0, now}
"""

# KEYS: daemons, -, hidden, hidden:loaded; ARGV: timeout (ms), batch. One dead
# daemon's next batch of users withdrawn: {daemon, its last heartbeat (ms),
# {users now offline}}, or {} when no daemon is dead.
SWEEP = _PUBLISH_IF_SHOWN + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]), 'WITHSCORES', 'LIMIT', 0, 1)
if #dead == 0 then return {} end
local daemon, seen = dead[1], dead[2]
local du = 'chat:du:' .. daemon
local users = redis.call('SPOP', du, tonumber(ARGV[2]))
local gone = {}
for _, user in ipairs(users) do
  local on = 'chat:on:' .. user
  if redis.call('SREM', on, daemon) == 1 and redis.call('SCARD', on) == 0 then
    gone[#gone + 1] = user
    publish_if_shown(user, '0 ' .. user .. ' ' .. seen)
  end
end
if redis.call('SCARD', du) == 0 then redis.call('ZREM', KEYS[1], daemon) end
return {daemon, seen, gone}
"""

# KEYS: -, -, hidden, hidden:loaded, on:{user}; ARGV: user, hide (1/0), last seen (ms, or "" if none).
# What the user's watchers see change: offline with no last seen on hiding; online, or
# offline as last seen, on showing again.
SET_HIDDEN = """
if ARGV[2] == '1' then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('PUBLISH', 'chat:presence:' .. ARGV[1], '0 ' .. ARGV[1])
else
  redis.call('SREM', KEYS[3], ARGV[1])
  if redis.call('EXISTS', KEYS[4]) == 1 then
    if redis.call('SCARD', KEYS[5]) > 0 then
      redis.call('PUBLISH', 'chat:presence:' .. ARGV[1], '1 ' .. ARGV[1])
    else
      redis.call('PUBLISH', 'chat:presence:' .. ARGV[1], '0 ' .. ARGV[1] .. ' ' .. ARGV[3])
    end
  end
end
return 1
"""


# KEYS: hidden, hidden:loaded; ARGV: the hidden users. One step: no change is published from a half list.
LOAD_HIDDEN = """
redis.call('DEL', KEYS[1])
for _, user in ipairs(ARGV) do redis.call('SADD', KEYS[1], user) end
redis.call('SET', KEYS[2], 1)
return 1
"""


async def subscribe_forever(client: aioredis.Redis, channels: list[str], on_message: Callable[[bytes, bytes], None],
                           *, on_subscribed: Callable[[], None], on_away: Callable[[BaseException], None],
                           read_seconds: float, retry_seconds: float = 1.0,
                           sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
    """For the life of the process: ``on_message(channel, data)`` for each message published on
    ``channels``. ``on_subscribed()`` once Redis has confirmed every SUBSCRIBE (what is published
    from then on comes here), after each (re)connection; ``on_away(error)`` when the connection
    fails, then it subscribes again after ``retry_seconds``. ``client``: one of its own, since a
    subscribed connection can do nothing else."""
    while True:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(*channels)
            confirmed = 0
            while True:
                message = await pubsub.get_message(timeout=read_seconds)
                if message is None:
                    continue
                if message["type"] == "message":
                    on_message(message["channel"], message["data"])
                elif message["type"] == "subscribe":
                    confirmed += 1
                    if confirmed == len(channels):
                        on_subscribed()
        except REDIS_ERRORS as exc:
            on_away(exc)
        finally:
            await pubsub.aclose()
        await sleep(retry_seconds)


def connect(url: str, timeout_seconds: float, *, retries: int | None = None) -> aioredis.Redis:
    """A client whose every command gives up after ``timeout_seconds``: a Redis that hangs
    costs a signal, never a message. ``retries=0`` for a subscriber that must know of every
    lost connection: redis-py's own retry would reconnect and subscribe again unseen, and what
    was published meanwhile would be missed with nobody told."""
    if retries is None:  # redis-py's default retry
        return aioredis.from_url(url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds,
                                 health_check_interval=30)
    return aioredis.from_url(url, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds,
                             health_check_interval=30, retry=Retry(NoBackoff(), retries))


class SignalStore:
    """The commands of typing and presence, on one Redis client."""

    def __init__(self, client: aioredis.Redis):
        self.client = client
        self._announce: AsyncScript = client.register_script(ANNOUNCE)
        self._withdraw: AsyncScript = client.register_script(WITHDRAW)
        self._heartbeat: AsyncScript = client.register_script(HEARTBEAT)
        self._sweep: AsyncScript = client.register_script(SWEEP)
        self._set_hidden: AsyncScript = client.register_script(SET_HIDDEN)
        self._load_hidden: AsyncScript = client.register_script(LOAD_HIDDEN)

    async def close(self) -> None:
        await self.client.aclose()

    # --- typing -------------------------------------------------------------
    async def publish_typing(self, channels: Iterable[str], origin: str, sender: str, to: str, state: str) -> None:
        payload = f"{origin} {sender} {to} {state}"
        async with self.client.pipeline(transaction=False) as pipe:
            for channel in channels:
                pipe.publish(channel, payload)
            await pipe.execute()

    # --- presence -----------------------------------------------------------
    def _keys(self, user: str, daemon: str) -> list[str]:
        return [online_key(user), daemon_users_key(daemon), HIDDEN, HIDDEN_LOADED]

    async def apply(self, daemon: str, changes: list[tuple[str, int | None]]) -> list[int]:
        """Announces (``None``) or withdraws (last seen in ms) each user, in order, in one round trip;
        1 for each user who came online or went offline by it."""
        async with self.client.pipeline(transaction=False) as pipe:
            for user, last_seen in changes:
                await self._queue(pipe, daemon, user, last_seen)
            return [int(x) for x in await pipe.execute()]

    async def _queue(self, pipe: Pipeline, daemon: str, user: str, last_seen: int | None) -> None:
        """Queues the script on ``pipe`` (awaiting a script on a pipeline only queues it)."""
        if last_seen is None:
            await self._announce(self._keys(user, daemon), [daemon, user], client=pipe)
        else:
            await self._withdraw(self._keys(user, daemon), [daemon, user, last_seen], client=pipe)

    async def heartbeat(self, daemon: str) -> tuple[bool, int]:
        """(was this daemon's entry there, Redis's time in ms)."""
        had, now = await self._heartbeat([DAEMONS], [daemon])
        return bool(had), int(now)

    async def sweep(self, timeout_ms: int) -> tuple[str, int, list[str]] | None:
        """One batch of one dead daemon's users withdrawn: (daemon, its last heartbeat ms, users now offline)."""
        done = await self._sweep([DAEMONS, "", HIDDEN, HIDDEN_LOADED], [timeout_ms, SWEEP_BATCH])
        if not done:
            return None
        daemon, seen, gone = done
        return _text(daemon), int(seen), [_text(u) for u in gone]

    async def users_of(self, daemon: str) -> set[str]:
        return {_text(u) for u in await self.client.smembers(daemon_users_key(daemon))}

    async def online(self, users: list[str]) -> list[bool]:
        """Whether each user has a connection (or one in its grace) on a daemon that Redis holds."""
        if not users:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for user in users:
                pipe.exists(online_key(user))
            return [bool(x) for x in await pipe.execute()]

    async def hidden_loaded(self) -> bool:
        return bool(await self.client.exists(HIDDEN_LOADED))

    async def load_hidden(self, users: list[str]) -> None:
        """Redis lost its copy of the hidden list (or never had it): MySQL's, then the flag that trusts it."""
        await self._load_hidden([HIDDEN, HIDDEN_LOADED], users)

    async def set_hidden(self, user: str, hidden: bool, last_seen_ms: int | None) -> None:
        await self._set_hidden(["", "", HIDDEN, HIDDEN_LOADED, online_key(user)],
                               [user, 1 if hidden else 0, "" if last_seen_ms is None else last_seen_ms])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
