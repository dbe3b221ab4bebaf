"""What a relay routing by user hands a daemon, made by hand for the cores' tests
(tests/core/test_passed_over.py, tests/core/test_routed_join.py): documents, the
batches that carry some whole and pass the others over as (id, digest), and a
socket that records the ids it is sent."""

from __future__ import annotations

from datetime import UTC, datetime

from chat.messages import shown_digest
from oplog.events import Batch
from relay.routing import PASSED

NS = "chat.messages"
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def doc(i: int, sender: str, recipient: str) -> dict:
    return {"_id": i, "from": sender, "to": recipient, "body": f"m{i}", "created_at": WHEN, "client_msg_id": None}


def entry(d: dict) -> dict:
    return {"op": "i", "ns": NS, "o": d, "ts": None}


def batch(sent: list[dict], passed: list[dict]) -> Batch:
    """What a relay sends a daemon: ``sent`` whole, ``passed`` as (id, digest)."""
    return Batch([entry(d) for d in sent], b"".join(PASSED.pack(d["_id"], shown_digest(d)) for d in passed), NS)


class Sink:
    """A socket as the hub sees it: the ids it was sent, in order."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def send(self, msg_id: int, payload: bytes, frame: bytes | None) -> None:
        self.ids.append(msg_id)

    def overflow(self) -> None:
        raise AssertionError("nothing overflows here")

    def signal(self, payload: bytes) -> None:
        pass
