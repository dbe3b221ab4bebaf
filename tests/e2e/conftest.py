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

import pytest

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
