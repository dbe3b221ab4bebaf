"""A daemon's shutdown is bounded whatever its stores do: with MariaDB
stopped and FerretDB frozen (SIGSTOP), SIGTERM still closes every client
with 1012 and the process exits within its drain period and a short grace,
on the real servers. supervisord kills a daemon that overruns `stopwaitsecs`
(20 s), and its clients then wait for a TCP reset instead of a close frame.

The bound is the daemon's own: a watchdog (``chat.stopping.exit_by``) that
logs ``event=shutdown_overran`` once the drain and the grace have passed.
Steps that hang on a store are abandoned at their own bounds
(``event=shutdown_step_overran``); what the watchdog may still cut is the
interpreter's teardown after ``event=daemon_stopped``."""

import asyncio
import signal

import psutil
import pytest
import websockets

from tests.e2e.helpers import connect, post, receive
from harness.system import private_system
from tests.timing import PATIENCE, eventually

DRAIN_SECONDS = 1.0


@pytest.fixture
def system(tmp_path):
    with private_system(tmp_path, daemons=1, CHAT_DRAIN_SECONDS=DRAIN_SECONDS, CHAT_DB_TIMEOUT_SECONDS=2,
                        CHAT_RATE_LIMIT_PER_SECOND=0) as s:
        yield s


async def test_sigterm_with_both_stores_unresponsive_exits_within_the_drain_and_a_grace(system, users):
    alice, bob = users("alice"), users("bob")
    clients = [(await connect(system, bob))[0] for _ in range(20)]
    assert (await post(system, alice, bob, "before")).status_code == 201
    for ws in clients:
        assert [f["body"] for f in await receive(ws, 1)] == ["before"]
    ferretdb = system.dbs.ferretdb.proc
    ferretdb.send_signal(signal.SIGSTOP)
    system.dbs.mariadb.stop()  # returns once it has exited
    try:
        # Pooled connections to FerretDB are still open: a call on one of them
        # now waits for its socket timeout (10 s), as the Mongo client's close
        # does when it asks the server to end its sessions.
        await eventually(lambda: psutil.Process(ferretdb.pid).status() == psutil.STATUS_STOPPED, "FerretDB frozen")
        daemon = system.procs["daemon_0"]
        daemon.send_signal(signal.SIGTERM)
        codes = []
        for ws in clients:
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), PATIENCE)
            codes.append(ws.close_code)
        assert codes == [1012] * len(clients)
        await eventually(lambda: daemon.poll() is not None, "the daemon exits")
        assert daemon.returncode == 0
        log = (system.logdir / "daemon_0.log").read_text()
        # Every step ran, each within its own bound (the frozen store's abandoned at it)...
        assert "event=daemon_stopped" in log
        # a step that waited on a frozen store (the Mongo client's close, when it still
        # has sessions to end) was abandoned at its bound, not waited out
        overran = [line for line in log.splitlines() if "event=shutdown_step_overran" in line]
        assert all("action=abandoned" in line for line in overran), overran
        # ...and the process ended with status 0 either by itself or, if the interpreter's own
        # teardown then waited on a thread still stuck in a store call (a loaded machine makes
        # that wait long), by the watchdog at the drain plus the grace: the bound, kept.
        lines = log.splitlines()
        if any("event=shutdown_overran" in line for line in lines):
            assert lines.index(next(line for line in lines if "event=daemon_stopped" in line)) < \
                lines.index(next(line for line in lines if "event=shutdown_overran" in line))
    finally:
        ferretdb.send_signal(signal.SIGCONT)
        system.dbs.mariadb.start()
        system.procs.pop("daemon_0", None)
