"""The daemon's acceptor, on real sockets: every connection waiting in the
kernel's queue is taken at once (uvloop's own server takes one per loop
iteration, which left bursts of connects waiting seconds under load), each is
served, and after close() nothing more is accepted."""

import asyncio
import socket

import pytest
import uvloop

from chat.serve import reuseport_socket
from daemon.acceptor import Acceptor

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
        socket.create_connection(("127.0.0.1", port), timeout=2)
    return made_in_ten_iterations, echoes


@pytest.mark.parametrize("run", [uvloop.run, asyncio.run], ids=["uvloop", "asyncio"])
def test_a_burst_of_connects_is_taken_at_once_served_and_close_stops_accepting(run):
    made, echoes = run(_burst_then_close())
    assert made == BURST
    assert echoes == [b"%d\n" % i for i in range(BURST)]
