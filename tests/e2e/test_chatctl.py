"""`chatctl send` and `chatctl listen`, as a developer runs them, against real servers.
(`chatctl listen` behind a front door of two partitions: test_partitioned_delivery.py.)"""

import subprocess
import sys

import httpx
import orjson

from harness.servers import ROOT
from tests.timing import PATIENCE, eventually_sync


def chatctl(system, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chatctl.cli", *args], env=system.env, cwd=ROOT,
                          capture_output=True, text=True, timeout=PATIENCE)


def stored(system, sender: str, to: str, body: str) -> dict:
    """The stored message of a POST /v1/messages (as `chatctl send` prints it)."""
    reply = httpx.post(f"{system.api_url}/v1/messages", json={"to": to, "body": body},
                       headers={"Authorization": f"Bearer {system.token(sender)}"}, timeout=PATIENCE)
    assert reply.status_code == 201, reply.text
    return reply.json()


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


def test_chatctl_listen_mints_a_new_token_when_its_own_expires_and_resumes(system, users, tmp_path):
    alice, bob = users("alice"), users("bob")
    first = stored(system, alice, bob, "one")
    out, err = tmp_path / "listen.out", tmp_path / "listen.err"
    # Tokens of a second: the daemon closes the socket with 4001 within its heartbeat tick (a second) of exp.
    with open(out, "w") as stdout, open(err, "w") as stderr:
        listening = subprocess.Popen(
            [sys.executable, "-m", "chatctl.cli", "listen", "--as", bob, "--url", system.ws_url,
             "--since", str(int(first["id"]) - 1), "--count", "2", "--token-ttl", "1s"],
            env=system.env, cwd=ROOT, stdout=stdout, stderr=stderr, text=True)
    try:
        eventually_sync(lambda: out.read_text().count("\n") >= 1, "chatctl listen printed the first message")
        # Sent once the daemon has closed the first socket: only a socket on a renewed token can carry it.
        eventually_sync(lambda: "token closed with 4001: minted a new one" in err.read_text(),
                        "chatctl listen renewed its token after the daemon's 4001")
        second = stored(system, alice, bob, "two")
        assert listening.wait(PATIENCE) == 0, err.read_text()
    finally:
        listening.kill()
        listening.wait()
    assert [orjson.loads(line) for line in out.read_text().splitlines()] == [first, second]
