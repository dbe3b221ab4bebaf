"""The relay's benchmark (loadtest/relay_path.py) drives the real relay, and its check can fail."""

import asyncio

import bson
import pytest

from loadtest import relay_path
from relay.routing import batch_frame, cut, part_of


def test_each_daemon_gets_its_users_entries_and_every_other_id_from_the_real_relay():
    result = asyncio.run(relay_path.one_round(clients=50, count=2000, batch=100, daemons=3))
    # one_round stops (SystemExit) if any daemon's frames are not what it holds
    assert result["us_per_entry"] > 0 and result["bytes_per_entry"] > 0


def test_the_check_refuses_frames_that_lack_one_entry():
    replies, recipients = relay_path.oplog_replies(clients=4, count=10, batch=5)
    held = {"r0", "r1"}
    frames = []
    for reply in replies:
        entries = bson.decode(reply)["nextBatch"]
        part = part_of(relay_path.NAMESPACE, entries, [bson.encode(e) for e in entries])
        sent, passed = cut(part, held)
        frames.append(bson.decode(batch_frame(part.namespace, part.last_ts, sent, passed)))
    relay_path.check("d0", frames, held, replies, recipients)  # as the relay cuts them: accepted
    last = max(k for k, f in enumerate(frames) if f["b"])
    dropped = [*frames[:last], {**frames[last], "b": frames[last]["b"][:-1]}, *frames[last + 1:]]
    with pytest.raises(SystemExit):
        relay_path.check("d0", dropped, held, replies, recipients)
