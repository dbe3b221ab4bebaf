"""`chatctl send` and `chatctl listen`, as a developer runs them, against real servers."""

import subprocess
import sys
import time

import orjson
import pytest

from tests import front_door
from tests.e2e.test_partitioned_delivery import daemon_serving, user_in, writing_system
from tests.servers import ROOT
from tests.system import databases


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


def test_chatctl_listen_mints_a_new_token_when_its_own_expires_and_resumes(system, users):
    alice, bob = users("alice"), users("bob")
    first = orjson.loads(chatctl(system, "send", "--as", alice, "--api", system.api_url, bob, "one").stdout)
    listening = subprocess.Popen(
        [sys.executable, "-m", "chatctl.cli", "listen", "--as", bob, "--url", system.ws_url,
         "--since", str(int(first["id"]) - 1), "--count", "2", "--token-ttl", "3s"],
        env=system.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert orjson.loads(listening.stdout.readline()) == first
        started = time.monotonic()
        # The daemon closes the socket with 4001 within a heartbeat tick (1 s) of exp.
        time.sleep(max(0.0, 3 + 1.5 - (time.monotonic() - started)))
        second = orjson.loads(chatctl(system, "send", "--as", alice, "--api", system.api_url, bob, "two").stdout)
        out, err = listening.communicate(timeout=30)
    finally:
        listening.kill()
    assert listening.returncode == 0, err
    assert [orjson.loads(line) for line in out.splitlines()] == [second]


@pytest.fixture(scope="module")
def behind_front_door(tmp_path_factory):
    """Two partitions, a daemon for each, and nginx routing ``?partition=k``; without it, partition 0's daemon."""
    if not front_door.available():
        pytest.skip("nginx is not installed")
    with databases(tmp_path_factory.mktemp("chatctl-partitions"), partitions=2) as dbs, writing_system(dbs) as front:
        relay = {"CHAT_OPLOG_RELAY_SOCKET": front.env["CHAT_OPLOG_RELAY_SOCKET"]}
        with daemon_serving(dbs, "0", **relay) as d0, daemon_serving(dbs, "1", **relay) as d1, \
                front_door.front_door(d0.daemon_port, {0: d0.daemon_port, 1: d1.daemon_port}) as url:
            yield front, url


def test_chatctl_listen_follows_a_421_to_its_partition_and_resumes_with_cursors(behind_front_door):
    front, url = behind_front_door
    ann, ben = user_in(0, "ann"), user_in(1, "ben")
    for body in ("one", "two"):
        sent = chatctl(front, "send", "--as", ann, "--api", front.api_url, ben, body)
        assert sent.returncode == 0, sent.stderr
    # Partition 1 held nothing before: its cursor at epoch 0, position 0, resumes from its start.
    listened = chatctl(front, "listen", "--as", ben, "--url", url, "--since", "1.0.0", "--count", "2")
    assert listened.returncode == 0, listened.stderr
    frames = [orjson.loads(line) for line in listened.stdout.splitlines()]
    assert [(f["from"], f["to"], f["body"]) for f in frames] == [(ann, ben, "one"), (ann, ben, "two")]
    assert [f["cursor"] for f in frames] == [f"1.0.{f['id']}" for f in frames]
    # Resuming from the first one's cursor gives the second only.
    again = chatctl(front, "listen", "--as", ben, "--url", url, "--since", frames[0]["cursor"], "--count", "1")
    assert [orjson.loads(line) for line in again.stdout.splitlines()] == frames[1:]
