"""The relay's benchmark (loadtest/relay_path.py) drives the real relay, and its check fails on
what a wrong relay would send."""

import asyncio

import bson
import pytest

from loadtest import relay_path
from chat.messages import shown_digest
from relay.routing import PASSED, batch_frame, cut, part_of

HELD = {"r0", "r1"}


def test_each_daemon_gets_its_users_entries_and_every_other_id_from_the_real_relay():
    result = asyncio.run(relay_path.one_round(clients=50, count=2000, batch=100, daemons=3))
    # one_round stops (SystemExit) if any daemon's frames are not what it holds
    assert result["us_per_entry"] > 0 and result["bytes_per_entry"] > 0


def test_a_relay_that_fails_ends_the_run_with_its_error(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("routing failed")

    monkeypatch.setattr("relay.server.part_of", broken)
    with pytest.raises(RuntimeError, match="routing failed"):
        asyncio.run(relay_path.one_round(clients=10, count=400, batch=100, daemons=2))


def _frames(replies: list[bytes], held: set[str]) -> list[dict]:
    """What the relay's routing cuts for a daemon holding ``held``."""
    frames = []
    for reply in replies:
        entries = bson.decode(reply)["nextBatch"]
        part = part_of(relay_path.NAMESPACE, entries, [bson.encode(e) for e in entries])
        sent, passed = cut(part, held)
        frames.append(bson.decode(batch_frame(part.namespace, part.last_ts, sent, passed)))
    return frames


def _cut_by_recipient_only(replies: list[bytes], held: set[str]) -> list[dict]:
    """A wrong relay: a message from a held user to someone else is passed over."""
    frames = []
    for reply in replies:
        entries = bson.decode(reply)["nextBatch"]
        sent = [bson.encode(e) for e in entries if e["o"]["to"] in held]
        passed = b"".join(PASSED.pack(e["o"]["_id"], shown_digest(e["o"])) for e in entries if e["o"]["to"] not in held)
        frames.append(bson.decode(batch_frame(relay_path.NAMESPACE, entries[-1]["ts"], sent, passed)))
    return frames


def _with_last_entry(frames: list[dict], change) -> list[dict]:
    last = max(k for k, f in enumerate(frames) if f["b"])
    return [*frames[:last], {**frames[last], "b": change(frames[last]["b"])}, *frames[last + 1:]]


def test_the_check_takes_the_relays_own_cut_and_refuses_a_lost_a_changed_or_a_misrouted_entry():
    replies = relay_path.oplog_replies(clients=4, count=60, batch=20)
    frames = _frames(replies, HELD)
    relay_path.check("d0", frames, HELD, replies)  # as the relay cuts them: accepted
    docs = [e["o"] for r in replies for e in bson.decode(r)["nextBatch"]]
    assert any(d["from"] in HELD and d["to"] not in HELD for d in docs), "the seed has a held sender's message out"
    wrong = {
        "lost": _with_last_entry(frames, lambda b: b[:-1]),
        "changed": _with_last_entry(frames, lambda b: [*b[:-1], {**b[-1], "o": {**b[-1]["o"], "body": "?"}}]),
        "by its recipient only routed": _cut_by_recipient_only(replies, HELD),
    }
    for what, bad in wrong.items():
        with pytest.raises(SystemExit):
            relay_path.check("d0", bad, HELD, replies)
            pytest.fail(f"the check took a {what} entry")
