"""The host's oplog relay (relay/) as a process: one tail of the real
FerretDB, its batches passed to real daemons over a Unix socket. A system
whose daemons tail through the relay delivers every message once, in order,
while the relay is killed and restarted, whether it routes by user (the default) or
sends each daemon whole namespaces.

The relay's logic (the ring, the namespaces, a slow daemon cut off, the
protocol's checks) runs on a list of oplog events in tests/core/test_relay.py.
"""

import asyncio
import signal

import httpx
import pytest

from chatctl.client import Inbox, listen
from tests.e2e.helpers import post
from harness.system import running_system
from tests.timing import PATIENCE, eventually


def log_count(system, name: str, event: str) -> int:
    return (system.logdir / f"{name}.log").read_text().count(f"event={event}")


@pytest.mark.parametrize("routed", ["true", "false"], ids=["routed-by-user", "whole-namespaces"])
async def test_daemons_behind_a_relay_killed_and_restarted_deliver_every_message_once_in_order(dbs, users, routed):
    daemons = ("daemon_0", "daemon_1")
    with running_system(dbs, daemons=2, apis=1, relay=True, CHAT_RATE_LIMIT_PER_SECOND=0,
                        CHAT_GAP_CHECK_SECONDS=1, CHAT_RELAY_ROUTE_BY_USER=routed) as system:
        receivers = [users(f"r{i}") for i in range(8)]
        inboxes = {r: Inbox() for r in receivers}
        tasks = [asyncio.create_task(listen(system.ws_url, system.token(r), None, lambda f: None,
                                            max_backoff=0.5, inbox=inboxes[r])) for r in receivers]
        expected: dict[str, list[int]] = {r: [] for r in receivers}
        try:
            await eventually(lambda: all(inbox.hellos for inbox in inboxes.values()), "every receiver connected")
            async with httpx.AsyncClient(timeout=PATIENCE) as http:

                async def send(messages: range) -> None:
                    # Two to each receiver in each phase: every receiver's stream crosses both changes.
                    for i in messages:
                        to = receivers[i % len(receivers)]
                        r = await post(system, users("s"), to, f"m{i}", f"id-{i}", client=http)
                        assert r.status_code == 201, r.text
                        expected[to].append(int(r.json()["id"]))

                await send(range(16))
                connected = {d: log_count(system, d, "relay_connected") for d in daemons}
                ready = log_count(system, "relay", "relay_ready")
                system.stop("relay", signal.SIGKILL)
                await send(range(16, 32))  # stored while no relay runs: the daemons' gap check finds them
                system.start("relay")
                # The next relay's tail is open and both daemons tail through it again: what
                # follows reaches them through it (and shows the hole of what came before).
                await eventually(lambda: log_count(system, "relay", "relay_ready") > ready
                                 and all(log_count(system, d, "relay_connected") > connected[d] for d in daemons),
                                 "the daemons connected to the restarted relay")
                await send(range(32, 48))
            await eventually(lambda: all(set(expected[r]) <= inboxes[r].seen for r in receivers),
                             "every message delivered")
            for r in receivers:
                assert inboxes[r].duplicates == 0, f"{r} got a message twice"
                assert inboxes[r].ids == sorted(expected[r]), f"{r}: lost or out of order"
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # The daemons did not tail the oplog themselves: the relay did, for both.
        assert "event=tail_mode" in (system.logdir / "relay.log").read_text()
        for name in daemons:
            text = (system.logdir / f"{name}.log").read_text()
            assert "event=tail_mode" not in text
            assert "event=relay_connected" in text
