"""A listening Unix socket that only this user can connect to (the writer's and the relay's)."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path


def bind_owner_only(path: Path, program: str) -> socket.socket:
    """Mode 0600 from the start: chmod after bind would leave a moment open to
    everyone. A file left by a process that died is replaced; one that a live
    process listens on is not (``program`` names it in the refusal)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            raise SystemExit(f"{program}: another {program} process is listening on {path}")
        except ConnectionRefusedError:
            path.unlink()  # nobody listens there
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(umask)
    sock.listen(128)
    sock.setblocking(False)
    return sock
