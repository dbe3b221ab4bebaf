"""The daemon's acceptor, on real sockets: every connection waiting in the
kernel's queue is taken at once (uvloop's own server takes one per loop
iteration, which left bursts of connects waiting seconds under load), each is
served, and after close() nothing more is accepted."""

import asyncio
import os
import resource
import socket

import pytest
import uvloop
from pydantic import ValidationError

from chat.serve import reuseport_socket
from chat.settings import DaemonSettings
from daemon.acceptor import Acceptor, connection_ceiling
from tests.timing import S, eventually

BURST = 300


class Echo(asyncio.Protocol):
    made = 0

    def connection_made(self, transport):
        Echo.made += 1
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


async def _burst_then_close():
    Echo.made = 0
    loop = asyncio.get_running_loop()
    listener = reuseport_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    # connected before the loop runs again: all of them wait in the kernel's queue
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(BURST)]
    acceptor = Acceptor(loop, listener, Echo)
    acceptor.start()
    for _ in range(10):  # ten loop iterations, not a time
        await asyncio.sleep(0)
    made_in_ten_iterations = Echo.made
    for i, c in enumerate(clients):
        c.sendall(b"%d\n" % i)
    echoes = await asyncio.gather(*(loop.run_in_executor(None, c.recv, 64) for c in clients))
    acceptor.close()
    for c in clients:
        c.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2 * S)
    return made_in_ten_iterations, echoes


@pytest.mark.parametrize("run", [uvloop.run, asyncio.run], ids=["uvloop", "asyncio"])
def test_a_burst_of_connects_is_taken_at_once_served_and_close_stops_accepting(run):
    made, echoes = run(_burst_then_close())
    assert made == BURST
    assert echoes == [b"%d\n" % i for i in range(BURST)]


async def _bounded_and_paused():
    """BATCH bounds what one readiness event takes; out of file descriptors,
    accepting pauses (no busy loop on a socket that stays readable) and
    resumes by itself."""
    Echo.made = 0
    loop = asyncio.get_running_loop()
    listener = reuseport_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
    acceptor = Acceptor(loop, listener, Echo)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        acceptor._accept()  # one readiness event
        assert len(acceptor._pending) == 10  # the rest wait in the kernel's queue
        open_fds = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_fds - 5, hard))  # no descriptor left
        acceptor.start()
        for _ in range(10):
            await asyncio.sleep(0)
        assert Echo.made == 10  # nothing more could be accepted
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        # the pause ends by itself (RETRY_SECONDS), and the rest is accepted
        await eventually(lambda: Echo.made == 30, "accepting resumed after the pause")
        return Echo.made
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        acceptor.close()
        for c in clients:
            c.close()


def test_one_event_takes_at_most_a_batch_and_running_out_of_descriptors_pauses_then_resumes(caplog, monkeypatch):
    from daemon import acceptor as acceptor_module

    monkeypatch.setattr(acceptor_module, "BATCH", 10)
    monkeypatch.setattr(acceptor_module, "RETRY_SECONDS", 0.2)
    assert uvloop.run(_bounded_and_paused()) == 30
    assert "event=accept_paused error=EMFILE" in caplog.text


def test_the_accept_ceiling_stays_under_the_open_files_limit_at_the_largest_cap():
    assert connection_ceiling(2) == 66 and connection_ceiling(15_000) == 15_937
    assert connection_ceiling(18_000) <= 20_000 - 500  # room for the process's own files
    with pytest.raises(ValidationError):  # a cap whose ceiling would not fit is refused at start-up
        DaemonSettings(max_connections=18_001)
