"""The SIGTERM (or Ctrl-C) that stops a long-running process, as an event its main loop awaits."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable


def stop_on_signals() -> asyncio.Event:
    """Set by SIGTERM (supervisord's stopsignal) or SIGINT: the process then
    stops in its own order instead of dying mid-work."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def bounded(step: str, awaitable: Awaitable[object], seconds: float, log: logging.Logger) -> None:
    """Awaits one step of a shutdown for at most ``seconds``; past that it is
    abandoned (a driver call cancelled mid-way may clean up with more I/O to a
    server that hung) and logged, so that the next step still runs."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        log.warning("event=shutdown_step_overran step=%s seconds=%.1f action=abandoned", step, seconds)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
    elif not task.cancelled() and task.exception() is not None:
        log.warning("event=shutdown_step_failed step=%s error=%r", step, task.exception())


def exit_by(seconds: float, code: Callable[[], int], log: logging.Logger) -> threading.Timer:
    """A last resort: if the process has not exited ``seconds`` from now
    (a step no bound reaches: the event loop's own teardown, or an exit that
    joins a thread stuck in a database call), it exits at once, after a log
    line, with ``code()``. supervisord would otherwise kill it at
    ``stopwaitsecs`` with nothing said."""
    def hard_exit() -> None:
        log.error("event=shutdown_overran seconds=%.1f action=exit", seconds)
        logging.shutdown()
        os._exit(code())

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()
    return timer


def reraise_if_cancelling() -> None:
    """Called first in an ``except`` of a library's own error, in a loop that
    retries: if this task is being cancelled, the error was the cancel (PyMongo
    can report a socket operation cancelled mid-way as its own error, and 6 of
    150 cancels of an oplog tail were lost that way, measured), and the loop
    must end instead of retrying for ever: a shutdown would wait for it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
