"""What a process refuses to start with, as an operator sees it: the exit
status and the message on stderr."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chat import auth
from chat.auth_config import NEW_SECRET_COMMAND
from chat.settings import DEV_JWT_SECRET
from tests.servers import ROOT, free_port

STRONG = "test-secret-0123456789abcdef0123456789"


def start(args: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CHAT_")}
    ports = {"CHAT_API_PORT": str(free_port()), "CHAT_DAEMON_PORT": str(free_port())}
    return subprocess.run([sys.executable, *args], env={**clean, **ports, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("module", ["api", "daemon"])
@pytest.mark.parametrize("secret, says", [
    (None, "CHAT_JWT_SECRET is not set: the built-in default is public"),
    ("change-me", "CHAT_JWT_SECRET is a placeholder"),
    ("0123456789abcdef0123456789abcde", "CHAT_JWT_SECRET is 31 bytes long, shorter than 32"),
])
def test_a_process_with_a_weak_secret_exits_and_says_how_to_fix_it(module, secret, says):
    done = start(["-m", module], **({"CHAT_JWT_SECRET": secret} if secret is not None else {}))
    assert done.returncode == 1
    assert f"{module}: refusing to start: {says}" in done.stderr
    assert NEW_SECRET_COMMAND in done.stderr


def test_the_api_refuses_dev_login_outside_development_mode():
    done = start(["-m", "api"], CHAT_JWT_SECRET=STRONG, CHAT_DEV_LOGIN="true")
    assert done.returncode == 1
    assert "api: refusing to start: CHAT_DEV_LOGIN=true lets anyone log in as any user" in done.stderr


def test_chatctl_signs_with_the_default_secret_only_in_development_mode():
    refused = start(["-m", "chatctl.cli", "token", "alice"])
    assert refused.returncode == 1 and refused.stdout == ""
    assert "chatctl: refusing to start: CHAT_JWT_SECRET is not set" in refused.stderr
    dev = start(["-m", "chatctl.cli", "token", "alice"], CHAT_DEV_MODE="true")
    assert dev.returncode == 0, dev.stderr
    assert auth.verify(DEV_JWT_SECRET, dev.stdout.strip()) == "alice"
