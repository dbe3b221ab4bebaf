"""The daemon's heartbeat loop, without sockets: every WebSocket is visited
each tick, HEARTBEAT_SLICE at a time, with the event loop free between slices
(deliveries go first), and one closed during the pass is not visited."""

import asyncio

from chat.settings import Settings
from daemon.hub import Hub
from daemon.lifecycle import HEARTBEAT_SLICE, heartbeats
from daemon.server import Daemon

SOCKETS = 2 * HEARTBEAT_SLICE + 88  # three slices, the last one short


class Beat:
    """Stands in for a Connection: what the loop calls, and when."""

    def __init__(self, name: int, log: list, deliveries: list):
        self.name, self.log, self.deliveries = name, log, deliveries

    def heartbeat(self, now: float) -> None:
        self.log.append((self.name, len(self.deliveries)))


async def test_heartbeats_visit_every_socket_in_slices_and_let_deliveries_run():
    settings = Settings(_env_file=None, ping_interval_seconds=0.4, ping_timeout_seconds=0.4)  # a tick of 0.1 s
    daemon = Daemon(settings, Hub(settings.send_buffer_max_bytes), stream=None)
    log: list[tuple[int, int]] = []
    deliveries: list[int] = []
    beats = [Beat(i, log, deliveries) for i in range(SOCKETS)]
    daemon.sockets.update(beats)
    closing = list(daemon.sockets)[-1]  # the last of the pass (the loop copies the set in this order)

    async def deliver():  # what else the loop runs: one step per loop iteration
        while True:
            deliveries.append(1)
            if len(log) == HEARTBEAT_SLICE:
                daemon.sockets.discard(closing)  # closed while the first slice was visited
            await asyncio.sleep(0)

    other = asyncio.create_task(deliver())
    beating = asyncio.create_task(heartbeats(daemon))
    while len(log) < SOCKETS - 1:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.02)  # the rest of the pass, if there were one
    beating.cancel()
    other.cancel()
    await asyncio.gather(beating, other, return_exceptions=True)

    first_pass = log[:SOCKETS - 1]
    assert sorted(name for name, _ in first_pass) == sorted(b.name for b in beats if b is not closing)
    seen = [deliveries_then for _, deliveries_then in first_pass]
    slices = [seen[i:i + HEARTBEAT_SLICE] for i in range(0, len(seen), HEARTBEAT_SLICE)]
    assert [len(s) for s in slices] == [HEARTBEAT_SLICE, HEARTBEAT_SLICE, SOCKETS - 1 - 2 * HEARTBEAT_SLICE]
    assert all(len(set(s)) == 1 for s in slices)  # no delivery inside a slice...
    assert slices[0][0] < slices[1][0] < slices[2][0]  # ...and some between slices
