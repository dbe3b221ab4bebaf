"""The compiled load client (loadtest/clients/go) against the real system: built by its
install script, it holds a few connections to the daemons, counts every message of every
device once, and says so in its JSON result."""

import shutil
import time

import httpx
import pytest

from loadtest.clients import loadclient
from tests.e2e.helpers import post
from tests.timing import PATIENCE, eventually_sync

pytestmark = pytest.mark.skipif(shutil.which("go") is None,
                                reason="Go is not installed: scripts/install-loadclient.sh cannot build the client")


@pytest.fixture(scope="module")
def binary():
    return loadclient.install()


async def test_every_device_gets_each_message_once_and_the_client_says_so(system, users, binary, tmp_path):
    alice, bob, carol = users("alice"), users("bob"), users("carol")
    sender = users("sender")  # no connection: each message is one frame per device of its recipient
    devices = [alice, bob, bob, carol]  # bob on two devices
    to = [alice] * 5 + [bob] * 7 + [carol] * 3
    owed = {alice: 5, bob: 7, carol: 3}
    opts = loadclient.Options(
        "ours", system.ws_url, loadclient.write_users(tmp_path / "users.txt", devices), system.secret,
        sources=("127.0.0.2", "127.0.0.3"), expect=loadclient.write_expect(tmp_path / "owed.txt", owed),
        until_complete=True, ids_out=tmp_path / "run", per_device=True)
    client = loadclient.Running(opts, binary)
    try:
        eventually_sync(lambda: client.connected() == len(devices), "every device connected")
        async with httpx.AsyncClient(timeout=PATIENCE) as http:
            for i, user in enumerate(to):
                # The body starts with the send time, as the benchmarks' feeds put it there.
                r = await post(system, sender, user, f"{time.time():.6f} m{i}", client=http)
                assert r.status_code == 201, r.text
        res = client.wait()  # it ends by itself once every device has what it is owed
    finally:
        client.kill()

    assert res["ended_by"] == "complete" and res["complete"] is True
    assert res["connected"] == len(devices) and res["connect_failures"] == 0
    assert (res["received"], res["lost"], res["duplicated"], res["unexpected"]) == (5 + 7 * 2 + 3, 0, 0, 0)
    assert res["frames"] == res["received"] and res["latency_ms"]["count"] == res["received"]
    by_device = sorted((d["user"], d["received"], d["lost"], d["duplicated"]) for d in res["devices"])
    assert by_device == sorted([(alice, 5, 0, 0), (bob, 7, 0, 0), (bob, 7, 0, 0), (carol, 3, 0, 0)])
    assert res["cpu_us_per_frame"] > 0 and res["cpu_seconds"]["user"] + res["cpu_seconds"]["system"] > 0
    ids, lat = loadclient.read_arrivals(tmp_path / "run")
    assert len(ids) == res["received"] and all(v >= 0 for v in lat)
    tally = loadclient.peer_tally(res)
    assert (tally["duplicates"], tally["lost"], tally["frames"]) == (0, 0, res["frames"])


def test_the_clients_own_parsing_and_accounting(binary):
    """Its Go tests: the JSON fields it picks out of frames, the latency buckets, the tally."""
    import subprocess

    run = subprocess.run(["go", "test", "./..."], cwd=loadclient.ROOT / "loadtest" / "clients" / "go",
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
