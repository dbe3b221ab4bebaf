"""A message as the API hands it to the writer: checked, and without an id yet."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Draft:
    sender: str
    recipient: str
    body: str
    client_msg_id: str | None = None
