"""The Autobahn suite's one-time install, started early.

scripts/autobahn-setup.sh installs `wstest` into .cache/autobahn/ once (Debian
11 packages and pip installs: about a minute on a fresh clone). When the
Autobahn tests are collected and the suite is not installed yet, the script
starts in the background as soon as collection ends, its output in
test-artifacts/, and runs while the tests before them do; the `wstest`
fixture of tests/e2e/test_autobahn.py waits for it (`autobahn_setup`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from chatctl.client import Inbox
from tests.frame_contract import violations

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "autobahn-setup.sh"
INSTALL = ROOT / ".cache" / "autobahn"
_STARTED = pytest.StashKey["Setup"]()


@dataclass
class Setup:
    """A run of scripts/autobahn-setup.sh, its stdout and stderr in ``log``."""
    proc: subprocess.Popen
    log: Path

    def wait(self) -> tuple[int, str]:
        """Its exit status and its output, once it has ended."""
        return self.proc.wait(), self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Ends it, and what it started (apt-get, pip), if it still runs: a later
        run starts over (it marks the install done only at its end)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_setup() -> Setup:
    # One log per pytest process (xdist workers each start one; the script's flock lets one install).
    log = ROOT / "test-artifacts" / f"autobahn-setup-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.log"
    log.parent.mkdir(exist_ok=True)
    with open(log, "wb") as out:
        # nice: it shares the cores with the tests it overlaps.
        proc = subprocess.Popen(["nice", "-n", "10", str(SETUP)], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Setup(proc, log)


def installed() -> bool:
    """Installed by the script, at some version of its pins (it checks which, and reinstalls)."""
    return os.access(INSTALL / "wstest", os.X_OK) and (INSTALL / ".installed").exists()


def pytest_collection_finish(session: pytest.Session) -> None:
    if not installed() and any(item.path.name == "test_autobahn.py" for item in session.items):
        session.config.stash[_STARTED] = start_setup()


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A session that ends before the Autobahn tests (-x, Ctrl-C) leaves no install running.
    if (setup := session.config.stash.get(_STARTED, None)) is not None:
        setup.stop()


@pytest.fixture(scope="session")
def autobahn_setup(request: pytest.FixtureRequest):
    """The setup's exit status and output: the one started at collection,
    waited for, else a run now (at once when the suite is installed)."""
    setup = request.config.stash.get(_STARTED, None) or start_setup()
    try:
        yield setup.wait()
    finally:
        setup.stop()  # when the wait was cut short (pytest-timeout)


@pytest.fixture(autouse=True)
def frames_match_the_asyncapi_document(monkeypatch):
    """Every WebSocket frame a client of chatctl's receives in a test, and
    every long-poll answer, is checked against the AsyncAPI document
    (tests/frame_contract.py); the test fails at its end naming each one
    that differs. (tests/e2e/helpers.py checks the frames it reads itself.)"""
    found: list[str] = []
    accept = Inbox.accept

    def checked_accept(inbox: Inbox, frame: dict) -> bool:
        found.extend(violations(frame))
        return accept(inbox, frame)

    def check_poll(request: httpx.Request, response: httpx.Response) -> None:
        if request.url.path == "/v1/poll" and response.status_code == 200 and response.is_stream_consumed:
            found.extend(violations(response.json(), "PollAnswer"))

    async_send, send = httpx.AsyncClient.send, httpx.Client.send

    async def checked_async_send(client: httpx.AsyncClient, request: httpx.Request, **kwargs) -> httpx.Response:
        response = await async_send(client, request, **kwargs)
        check_poll(request, response)
        return response

    def checked_send(client: httpx.Client, request: httpx.Request, **kwargs) -> httpx.Response:
        response = send(client, request, **kwargs)
        check_poll(request, response)
        return response

    monkeypatch.setattr(Inbox, "accept", checked_accept)
    monkeypatch.setattr(httpx.AsyncClient, "send", checked_async_send)
    monkeypatch.setattr(httpx.Client, "send", checked_send)
    yield
    assert found == [], "frames that differ from the AsyncAPI document"
