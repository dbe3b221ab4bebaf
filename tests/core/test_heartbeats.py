"""The daemon's heartbeat loop, without sockets: every WebSocket that is due
is visited, HEARTBEAT_SLICE at a time, with the event loop free between slices
(deliveries go first); one closed during the pass is not visited, and one not
due yet is not visited until it is."""

import asyncio
import time

from chat.settings import Settings
from daemon.hub import Hub
from daemon.lifecycle import HEARTBEAT_SLICE, heartbeats
from daemon.server import Daemon

SOCKETS = 2 * HEARTBEAT_SLICE + 88  # three slices, the last one short


class Beat:
    """Stands in for a Connection: what the loop calls, and when."""

    def __init__(self, name: int, log: list, deliveries: list, due: float = 0.0):
        self.name, self.log, self.deliveries, self.due = name, log, deliveries, due

    def heartbeat(self, now: float) -> None:
        self.log.append((self.name, len(self.deliveries)))

    def next_due(self) -> float:
        return self.due  # 0: due every tick


async def test_heartbeats_visit_every_socket_in_slices_and_let_deliveries_run():
    settings = Settings(_env_file=None, ping_interval_seconds=0.4, ping_timeout_seconds=0.4)  # a tick of 0.1 s
    daemon = Daemon(settings, Hub(settings.send_buffer_max_bytes), stream=None)
    log: list[tuple[int, int]] = []
    deliveries: list[int] = []
    beats = [Beat(i, log, deliveries) for i in range(SOCKETS)]
    for beat in beats:
        daemon.join(beat)  # type: ignore[arg-type]
    closing = beats[-1]  # the last of the pass (all due at once, they come out in the order they joined)

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


class Pinged:
    """Stands in for a Connection with something due at ``due``: once acted on, due 10 s later."""

    def __init__(self, due: float):
        self.due, self.visits = due, []

    def heartbeat(self, now: float) -> None:
        self.visits.append(now)
        if now >= self.due:
            self.due = now + 10

    def next_due(self) -> float:
        return self.due


async def test_a_socket_is_visited_when_it_is_due_not_every_tick():
    settings = Settings(_env_file=None, ping_interval_seconds=0.4, ping_timeout_seconds=0.4)  # a tick of 0.1 s
    daemon = Daemon(settings, Hub(settings.send_buffer_max_bytes), stream=None)
    start = time.monotonic()
    soon, later, closed = Pinged(start + 0.25), Pinged(start + 0.65), Pinged(start + 0.25)
    for conn in (soon, later, closed):
        daemon.join(conn)  # type: ignore[arg-type]
    daemon.sockets.discard(closed)  # closed before it was due: dropped, never visited
    beating = asyncio.create_task(heartbeats(daemon))
    await asyncio.sleep(1.0)
    beating.cancel()
    await asyncio.gather(beating, return_exceptions=True)
    assert closed.visits == []
    for conn, due in ((soon, start + 0.25), (later, start + 0.65)):
        assert 1 <= len(conn.visits) <= 2  # once due, and at most once a bucket before it
        assert conn.visits[-1] >= due and conn.visits[0] >= due - daemon.due.resolution
    assert len(daemon.due) == 2  # both scheduled again (10 s on), the closed one gone
