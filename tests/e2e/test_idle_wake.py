"""An idle FerretDB tail backs off (oplog/pace.py), and the writer's wake through
Redis (oplog/wake.py) brings it back at once: a message after a quiet spell is
delivered by the poll the wake started, not by the backoff running out.

The backoff's cap is set long here (5 s), and the message is posted once the
tail (the relay's, or a daemon's that tails by itself) polls at that cap
(``tail_idle``). It logs the wake that cut the backoff short (``tail_woken``)
and then that the poll at the pace the wake gave back found the entry
(``tail_wake_found``): no backoff ran out in between.
The decisions alone (the pace, the writer's throttle) are tests/core/test_idle_pace.py's.
"""

import asyncio

import pytest

from chatctl.client import Inbox, listen
from harness.system import running_system
from tests.e2e.helpers import post
from tests.timing import eventually


def log_count(system, name: str, event: str) -> int:
    return (system.logdir / f"{name}.log").read_text().count(f"event={event}")


@pytest.mark.parametrize("relay", [True, False], ids=["through-the-relay", "a-daemon-tailing-itself"])
async def test_a_message_after_a_quiet_spell_is_delivered_by_the_writer_s_wake(dbs, users, relay):
    tailer = "relay" if relay else "daemon_0"
    with running_system(dbs, daemons=1, apis=1, writer=True, relay=relay,
                        CHAT_FERRETDB_TAIL_IDLE_POLL_MS="5000") as system:
        await eventually(lambda: log_count(system, tailer, "wake_listening"), "the tail listens for wakes")
        receiver = users("r")
        inbox = Inbox()
        listening = asyncio.create_task(listen(system.ws_url, system.token(receiver), None, lambda f: None,
                                               inbox=inbox))
        try:
            await eventually(lambda: inbox.hellos, "the receiver connected")
            first = await post(system, users("s"), receiver, "before the quiet")
            assert first.status_code == 201, first.text
            await eventually(lambda: int(first.json()["id"]) in inbox.seen, "the first message delivered")
            idle = log_count(system, tailer, "tail_idle")
            await eventually(lambda: log_count(system, tailer, "tail_idle") > idle,
                             "the tail polls at its idle cap")
            woken, found = log_count(system, tailer, "tail_woken"), log_count(system, tailer, "tail_wake_found")
            after = await post(system, users("s"), receiver, "after the quiet")
            assert after.status_code == 201, after.text
            await eventually(lambda: int(after.json()["id"]) in inbox.seen, "the message after the quiet delivered")
            await eventually(lambda: log_count(system, tailer, "tail_wake_found") > found,
                             "the poll the wake started found it")
            assert log_count(system, tailer, "tail_woken") == woken + 1
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
