"""What a client sends on ``/v1/ws`` after its hello: delivery acks and read
markers (docs/receipts.md, "What a client sends"), on their way to the host's
writer, which judges and stores them as it does the API's; typing and watch
frames (docs/presence.md), on their way to ``daemon.signals``.

A flood never becomes a queue: a connection keeps at most one ack (the highest)
and one marker per peer waiting, and sends one request at a time; a newer
frame replaces a waiting one (an ack or a marker "up to" says all an older
one did). So with watch lists: one snapshot is read at a time, and the newest
list waits. Typing refreshes beyond one a second per peer are dropped. A
refusal is an ``error`` frame, and the socket stays open; an ack, read, typing
or watch frame of the wrong shape is a protocol error of the client's (close
1007); a JSON object of another ``type`` gets an ``unknown_type`` error frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import orjson

from chat.auth import is_user_id
from chat.drafts import Draft
from chat.errors import ChatError
from chat.messages import Kind, Message
from chat.parsing import is_decimal, is_device_id
from chat.write_errors import WRITE_FAILURES, answer_for
from daemon import metrics
from chat.typing_gate import TypingGate
from daemon.presence import TYPING_PEERS_MAX
from daemon.signals import Signals, Unavailable, Watcher

log = logging.getLogger("chat.daemon")

ID_MAX = 2**63 - 1
DEFAULT_DEVICE = "default"  # the device a socket's acks count for when its handshake names none
# Peers whose read markers may wait at once on one connection: a client that
# reads more conversations than this between two answers of the writer gets
# its oldest waiting marker replaced by the newest (it is resent by the client
# as it reads on; the reader's unread count stays exact in MySQL either way).
READS_WAITING_MAX = 64

Submit = Callable[[Draft], Awaitable[tuple[Message, bool]]]


class BadClientFrame(ChatError):
    """Not an ``ack`` or ``read`` frame of the contract: the reason is the close frame's."""


class Ack(NamedTuple):
    upto: int


class Read(NamedTuple):
    peer: str
    upto: int


class Typing(NamedTuple):
    to: str
    state: str


class Watch(NamedTuple):
    users: list[str]


class Unknown(NamedTuple):
    type: str


# Each type's fields, in the order the close reason names them
FIELDS = {"ack": ("type", "upto"), "read": ("type", "peer", "upto"), "typing": ("type", "to", "state"),
          "watch": ("type", "users")}
OPTIONAL = {"state"}  # a typing frame without it says "start"
TYPE_MAX_CHARS = 32  # of an unknown type, as the error frame repeats it


def parse(data: bytes) -> Ack | Read | Typing | Watch | Unknown | None:
    """The frame; None for data that is not a JSON object with a string ``type``
    (dropped: a WebSocket library's own test messages); ``BadClientFrame`` for a
    frame of the contract's types with the wrong shape."""
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        return None
    kind = frame["type"]
    fields = FIELDS.get(kind)
    if fields is None:
        return Unknown(kind[:TYPE_MAX_CHARS])
    if not set(fields) - OPTIONAL <= set(frame) <= set(fields):
        raise BadClientFrame(f"{kind} frame fields are {', '.join(fields)}")
    if kind == "typing":
        state = frame.get("state", "start")
        if not is_user_id(frame["to"]):
            raise BadClientFrame("to must be a user id")
        if state not in ("start", "stop"):
            raise BadClientFrame("state must be start or stop")
        return Typing(frame["to"], state)
    if kind == "watch":
        users = frame["users"]
        if not isinstance(users, list) or not all(is_user_id(u) for u in users):
            raise BadClientFrame("users must be a list of user ids")
        return Watch(users)
    upto = frame["upto"]
    if not (isinstance(upto, str) and is_decimal(upto, 19) and 1 <= int(upto) <= ID_MAX):
        raise BadClientFrame("upto must be a message id (a decimal string)")
    if kind == "read":
        peer = frame["peer"]
        if not is_user_id(peer):
            raise BadClientFrame("peer must be a user id")
        return Read(peer, int(upto))
    return Ack(int(upto))


def device_of(raw: str | None) -> str | None:
    """The handshake's ``device`` parameter, checked (a user id's alphabet and length); None if bad."""
    if raw is None:
        return DEFAULT_DEVICE
    return raw if is_device_id(raw) else None


class ClientFrames:
    """One WebSocket's acks and read markers, waiting for the writer, one request at a time;
    its typing and watch frames, on their way to the daemon's signals."""

    __slots__ = ("_ack", "_conn", "_device", "_gate", "_reads", "_send_text", "_sending", "_signals", "_submit",
                 "_user", "_watch", "_watching", "_clock")

    def __init__(self, user: str, device: str, submit: Submit | None, send_text: Callable[[bytes], None], *,
                 signals: Signals | None = None, conn: Watcher | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._user, self._device = user, device
        self._submit = submit  # None: no writer on this host (development without one)
        self._send_text = send_text
        self._ack = 0
        self._reads: dict[str, int] = {}
        self._sending: asyncio.Task | None = None
        self._signals = signals  # None: no Redis (CHAT_REDIS_URL empty)
        self._conn = conn  # the connection, as its watchers know it
        self._clock = clock
        self._gate: TypingGate | None = None  # made at its first typing frame
        self._watch: list[str] | None = None  # the newest watch list, waiting for the one being read
        self._watching: asyncio.Task | None = None

    def take(self, data: bytes) -> None:
        """One client frame; raises ``BadClientFrame``."""
        parsed = parse(data)
        if parsed is None:
            return
        if isinstance(parsed, Ack):
            self._ack = max(self._ack, parsed.upto)
        elif isinstance(parsed, Read):
            reads = self._reads
            if parsed.peer not in reads and len(reads) >= READS_WAITING_MAX:
                del reads[next(iter(reads))]
            reads[parsed.peer] = max(reads.get(parsed.peer, 0), parsed.upto)
        elif isinstance(parsed, Typing):
            self._typing(parsed)
            return
        elif isinstance(parsed, Watch):
            self._watch_list(parsed.users)
            return
        else:
            self._error(parsed.type, "unknown_type", "frames a client sends are ack, read, typing and watch "
                        "(docs/presence.md, docs/receipts.md)")
            return
        if self._sending is None or self._sending.done():
            self._sending = asyncio.get_running_loop().create_task(self._send_waiting())

    def close(self) -> None:
        """The socket is gone: what waits is dropped (the client sends it again on its next connection)."""
        if self._sending is not None:
            self._sending.cancel()
        if self._watching is not None:
            self._watching.cancel()
        if self._signals is not None and self._conn is not None:
            self._signals.forget(self._conn)

    # --- typing and presence ------------------------------------------------------
    def _typing(self, frame: Typing) -> None:
        signals = self._signals
        if signals is None:
            self._error("typing", "signals_unavailable", "this server has no Redis (CHAT_REDIS_URL)")
            return
        gate = self._gate
        if gate is None:
            gate = self._gate = TypingGate(TYPING_PEERS_MAX)
        if not gate.passes(frame.to, frame.state, self._clock()):
            metrics.SIGNALS.labels("typing", "throttled").inc()
            return
        try:
            signals.typing(id(self._conn), self._user, frame.to, frame.state)
        except Unavailable as exc:
            self._error("typing", exc.code, str(exc))

    def _watch_list(self, users: list[str]) -> None:
        signals = self._signals
        if signals is None:
            self._error("watch", "signals_unavailable", "this server has no Redis (CHAT_REDIS_URL)")
            return
        most = signals.settings.signals.presence_watch_max
        if len(users) > most:
            self._error("watch", "watch_too_many", f"a connection watches at most {most} users "
                        "(CHAT_PRESENCE_WATCH_MAX); the list is unchanged")
            return
        self._watch = users
        if self._watching is None or self._watching.done():
            self._watching = asyncio.get_running_loop().create_task(self._send_snapshots(signals))

    async def _send_snapshots(self, signals: Signals) -> None:
        while self._watch is not None:
            users, self._watch = self._watch, None
            assert self._conn is not None, "a connection that watches is given to its frames"
            try:
                self._send_text(await signals.watch(self._conn, users))
            except Unavailable as exc:
                self._error("watch", exc.code, str(exc))
            except Exception:
                log.exception("event=watch_failed")
                self._error("watch", "server_error", "internal error; send it again")

    # --- acks and read markers ------------------------------------------------------
    async def _send_waiting(self) -> None:
        while self._ack or self._reads:
            if self._ack:
                draft = Draft(self._user, self._device, "", None, Kind.ACK, self._ack)
                self._ack = 0
            else:
                peer = next(iter(self._reads))
                draft = Draft(self._user, peer, "", None, Kind.READ, self._reads.pop(peer))
            await self._one(draft)

    async def _one(self, draft: Draft) -> None:
        frame = "ack" if draft.kind == Kind.ACK else "read"
        if self._submit is None:
            self._error(frame, "writer_unavailable", "this host has no writer (CHAT_WRITER_SOCKET)")
            return
        try:
            await self._submit(draft)
        except WRITE_FAILURES as exc:
            answer = answer_for(exc)
            if answer.status == 503:  # docs/receipts.md, "Errors": any way the write path is away is one code
                self._error(frame, "writer_unavailable", "the writer did not take it; send it again")
            else:
                self._error(frame, answer.code, answer.message)
        except Exception:
            log.exception("event=client_frame_failed frame=%s", frame)
            self._error(frame, "server_error", "internal error; send it again")

    def _error(self, frame: str, code: str, message: str) -> None:
        self._send_text(orjson.dumps({"type": "error", "code": code, "message": message, "frame": frame}))
