"""A write as the API (or a daemon) hands it to the writer: checked, and without an id yet."""

from __future__ import annotations

from dataclasses import dataclass

from chat.messages import Kind


@dataclass(frozen=True, slots=True)
class Draft:
    """A message, or an event (docs/receipts.md) with ``kind`` and ``ref_id``:
    EDIT/DELETE name the sender's message (``recipient`` is left "" and filled
    from it by the writer), READ names the newest message of ``recipient``'s
    read, ACK the position a device of ``sender`` received up to (its device
    id in ``recipient``)."""

    sender: str
    recipient: str
    body: str
    client_msg_id: str | None = None
    kind: int = Kind.MESSAGE
    ref_id: int | None = None
