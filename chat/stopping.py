"""The SIGTERM (or Ctrl-C) that stops a long-running process, as an event its main loop awaits."""

from __future__ import annotations

import asyncio
import signal


def stop_on_signals() -> asyncio.Event:
    """Set by SIGTERM (supervisord's stopsignal) or SIGINT: the process then
    stops in its own order instead of dying mid-work."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
