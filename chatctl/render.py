"""``chatctl listen --format text``: each frame of the stream as one line a person reads.

The frames are the AsyncAPI document's (api/asyncapi.py, docs/receipts.md):
messages, and the events that change a conversation's state, each with its id
in the reader's stream, which the line starts with; ``ref`` and ``upto`` are
ids of that same stream, so the line names them alike (``#7``). Typing and
presence frames (docs/presence.md) are signals, not positions of the stream: no
id, no time, the line says who and what. A frame of a type this version does
not know is shown as its JSON, never dropped.
"""

from __future__ import annotations

import orjson


def _body(text: str) -> str:
    """A body on one line: its line breaks and other control characters escaped, as JSON would."""
    if text.isprintable():
        return text
    return orjson.dumps(text).decode()[1:-1]


def line(frame: dict) -> str:
    """One line for ``frame``: ``#id time who what``."""
    kind = frame.get("type")
    head = f"#{frame.get('id')} {frame.get('created_at')}"
    sender, to = frame.get("from"), frame.get("to")
    if kind == "message":
        if frame.get("deleted"):
            return f"{head} {sender} -> {to}: (deleted)"
        edited = " (edited)" if "edited_at" in frame else ""
        return f"{head} {sender} -> {to}: {_body(frame.get('body', ''))}{edited}"
    if kind == "edit":
        return f"{head} {sender} edited #{frame.get('ref')}: {_body(frame.get('body', ''))}"
    if kind == "delete":
        return f"{head} {sender} deleted #{frame.get('ref')}"
    if kind == "read":
        return f"{head} {sender} read {to}'s messages up to #{frame.get('upto')}"
    if kind == "delivered":
        return f"{head} {sender} received {to}'s messages up to #{frame.get('upto')}"
    if kind == "error":
        return f"refused {frame.get('frame')}: {frame.get('code')}: {frame.get('message')}"
    if kind == "typing":
        return _typing(frame)
    if kind == "presence" and isinstance(frame.get("users"), list):
        shown = "; ".join(_presence(user) for user in frame["users"] if isinstance(user, dict))
        return f"watching: {shown}" if shown else "watching nobody"
    if kind == "presence" and "user" in frame:
        return _presence(frame, "is ")
    return orjson.dumps(frame).decode()


def _typing(frame: dict) -> str:
    sender, to, ttl = frame.get("from"), frame.get("to"), frame.get("ttl")
    if frame.get("state") == "stop":
        return f"{sender} stopped typing to {to}"
    until = f" ({ttl:g} s)" if isinstance(ttl, int | float) and not isinstance(ttl, bool) else ""
    return f"{sender} is typing to {to}{until}"


def _presence(entry: dict, verb: str = "") -> str:
    """``alice online``, ``alice last seen <time>``, or ``alice offline`` (never seen, or hidden); with ``verb``,
    ``alice is online``, ``alice is offline, last seen <time>``, ``alice is offline``."""
    user, last_seen = entry.get("user"), entry.get("last_seen")
    if entry.get("online"):
        return f"{user} {verb}online"
    if last_seen is None:
        return f"{user} {verb}offline"
    return f"{user} {verb}offline, last seen {last_seen}" if verb else f"{user} last seen {last_seen}"


def hello_line(frame: dict) -> str:
    """A connection's greeting: whose stream, and the unread count (null: MySQL did not answer in time)."""
    unread = frame.get("unread")
    return f"connected as {frame.get('user')}, {'unread count unknown' if unread is None else f'{unread} unread'}"
