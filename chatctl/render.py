"""``chatctl listen --format text``: each frame of the stream as one line a person reads.

The frames are the AsyncAPI document's (api/asyncapi.py, docs/receipts.md):
messages, and the events that change a conversation's state, each with its id
in the reader's stream, which the line starts with; ``ref`` and ``upto`` are
ids of that same stream, so the line names them alike (``#7``). A frame of a
type this version does not know is shown as its JSON, never dropped.
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
    return orjson.dumps(frame).decode()


def hello_line(frame: dict) -> str:
    """A connection's greeting: whose stream, and the unread count (null: MySQL did not answer in time)."""
    unread = frame.get("unread")
    return f"connected as {frame.get('user')}, {'unread count unknown' if unread is None else f'{unread} unread'}"
