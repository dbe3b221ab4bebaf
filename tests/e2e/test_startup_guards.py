"""What a process refuses to start with, as an operator sees it: the exit
status and the message on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from chat import auth
from chat.auth_config import NEW_SECRET_COMMAND
from chat.settings import DEV_JWT_SECRET
from harness.servers import ROOT, free_port
from tests.timing import PATIENCE

STRONG = "test-secret-0123456789abcdef0123456789"
WEAK = [
    (None, "CHAT_JWT_SECRET is not set: the built-in default is public"),
    ("change-me", "CHAT_JWT_SECRET is a placeholder"),
    ("0123456789abcdef0123456789abcde", "CHAT_JWT_SECRET is 31 bytes long, shorter than 32"),
]
# Each start of this module, by name: (arguments, environment). A start is a
# Python process's start-up, about a second of CPU: they all go at once.
STARTS: dict[str, tuple[list[str], dict[str, str]]] = {
    **{f"{module} {secret}": (["-m", module], {"CHAT_JWT_SECRET": secret} if secret is not None else {})
       for module in ("api", "daemon") for secret, _ in WEAK},
    "api dev login": (["-m", "api"], {"CHAT_JWT_SECRET": STRONG, "CHAT_DEV_LOGIN": "true"}),
    "chatctl": (["-m", "chatctl.cli", "token", "alice"], {}),
    "chatctl dev": (["-m", "chatctl.cli", "token", "alice"], {"CHAT_DEV_MODE": "true"}),
}


def start(args: list[str], **env: str) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHAT_")}
    ports = {"CHAT_API_PORT": str(free_port()), "CHAT_DAEMON_PORT": str(free_port())}
    return subprocess.Popen([sys.executable, *args], env={**clean, **ports, **env}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def started() -> Iterator[Callable[[str], subprocess.CompletedProcess]]:
    """``started(name)``: how the start named in STARTS ended."""
    procs = {name: start(args, **env) for name, (args, env) in STARTS.items()}

    def ended(name: str) -> subprocess.CompletedProcess:
        proc = procs[name]
        out, err = proc.communicate(timeout=PATIENCE)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    try:
        yield ended
    finally:
        for proc in procs.values():
            if proc.poll() is None:  # a start that did not refuse
                proc.kill()
            proc.communicate()


@pytest.mark.parametrize("module", ["api", "daemon"])
@pytest.mark.parametrize("secret, says", WEAK)
def test_a_process_with_a_weak_secret_exits_and_says_how_to_fix_it(started, module, secret, says):
    done = started(f"{module} {secret}")
    assert done.returncode == 1
    assert f"{module}: refusing to start: {says}" in done.stderr
    assert NEW_SECRET_COMMAND in done.stderr


def test_the_api_refuses_dev_login_outside_development_mode(started):
    done = started("api dev login")
    assert done.returncode == 1
    assert "api: refusing to start: CHAT_DEV_LOGIN=true lets anyone log in as any user" in done.stderr


def test_chatctl_signs_with_the_default_secret_only_in_development_mode(started):
    refused = started("chatctl")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "chatctl: refusing to start: CHAT_JWT_SECRET is not set" in refused.stderr
    dev = started("chatctl dev")
    assert dev.returncode == 0, dev.stderr
    assert auth.verify(DEV_JWT_SECRET, dev.stdout.strip()) == "alice"
