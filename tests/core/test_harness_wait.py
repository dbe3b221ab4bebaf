"""The harness's readiness waits (harness/servers.py), on real sockets in a temporary folder."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from harness.servers import wait_unix_socket


def test_a_unix_socket_that_listens_is_ready(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen()
        wait_unix_socket(path, 5)  # returns: a connection was taken


def test_a_socket_bound_but_not_listening_is_not_ready(tmp_path):
    # mariadbd between binding its socket and listening on it: a connect is refused (errno 111)
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        with pytest.raises(TimeoutError, match="something listens on"):
            wait_unix_socket(path, 0.3)
        server.listen()
        wait_unix_socket(path, 5)


def test_a_server_that_exits_before_listening_says_so(tmp_path):
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    with pytest.raises(RuntimeError, match="exited with 0 before listening"):
        wait_unix_socket(tmp_path / "s.sock", 5, exited)
