"""`chatctl send` and `chatctl listen`, as a developer runs them, against real servers."""

import subprocess
import sys

import orjson

from tests.servers import ROOT


def chatctl(system, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chatctl.cli", *args], env=system.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_chatctl_send_then_listen_resumes_from_since(system, users):
    alice, bob = users("alice"), users("bob")
    first = chatctl(system, "send", "--as", alice, "--api", system.api_url, bob, "one", "--client-msg-id", "k1")
    assert first.returncode == 0, first.stderr
    stored = orjson.loads(first.stdout)
    again = chatctl(system, "send", "--as", alice, "--api", system.api_url, bob, "one", "--client-msg-id", "k1")
    assert orjson.loads(again.stdout) == stored  # a retry stores nothing new
    second = orjson.loads(chatctl(system, "send", "--as", alice, "--api", system.api_url, bob, "two").stdout)

    listened = chatctl(system, "listen", "--as", bob, "--url", system.ws_url, "--since", str(int(stored["id"]) - 1),
                       "--count", "2")
    assert listened.returncode == 0, listened.stderr
    assert [orjson.loads(line) for line in listened.stdout.splitlines()] == [stored, second]


def test_chatctl_send_refused_exits_non_zero(system, users):
    refused = chatctl(system, "send", "--as", users("alice"), "--api", system.api_url, "not a user", "x")
    assert refused.returncode == 1 and orjson.loads(refused.stdout)["field"] == "to"
