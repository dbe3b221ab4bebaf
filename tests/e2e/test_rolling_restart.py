"""The ops runbook's rolling restart, for real: supervisord runs the writer,
api and daemon programs exactly as supervisord.conf defines them (commands,
numprocs, stop signal and waits), and `supervisorctl restart` of each daemon,
then each API process, then the writer, while traffic flows, costs clients no
message and no repeat, and the write API keeps answering throughout.

Each restart comes once messages have been stored since the one before, and
the traffic goes on until messages have been stored through the restarted
writer."""

import asyncio
import configparser
import contextlib
import re
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from chatctl.client import Inbox, listen
from tests.e2e.helpers import post
from harness.servers import ROOT, free_port, wait_port
from harness.system import System
from tests.timing import PATIENCE, eventually

PROGRAMS = ("daemon:daemon_0", "daemon:daemon_1", "api:api_0", "api:api_1", "writer")
BETWEEN_RESTARTS = 10  # messages stored after one restart before the next


def supervisor_config(tmp: Path, env: dict[str, str]) -> Path:
    """supervisord.conf's writer, api and daemon programs, with paths moved to tmp."""
    real = configparser.RawConfigParser()
    real.read(ROOT / "supervisord.conf")
    conf = configparser.RawConfigParser()
    conf["unix_http_server"] = {"file": str(tmp / "supervisor.sock")}
    conf["supervisorctl"] = {"serverurl": f"unix://{tmp / 'supervisor.sock'}"}
    conf["rpcinterface:supervisor"] = dict(real["rpcinterface:supervisor"])
    conf["supervisord"] = {"logfile": str(tmp / "supervisord.log"), "pidfile": str(tmp / "supervisord.pid"),
                           "directory": str(ROOT), "nodaemon": "true"}
    env = {**env, "CHAT_WRITER_SOCKET": str(tmp / "writer.sock")}
    environment = ",".join(f'{k}="{v}"' for k, v in env.items() if k.startswith("CHAT_"))
    assert "CHAT_WRITER_SOCKET" in real["program:api"]["environment"]  # as deployed: through the writer
    for name in ("program:writer", "program:api", "program:daemon"):
        section = {k: v.replace("%(here)s", str(ROOT)) for k, v in real[name].items()}
        section["stdout_logfile"] = str(tmp / "%(program_name)s_%(process_num)d.log")
        section["environment"] = environment
        conf[name] = section
    path = tmp / "supervisord.conf"
    with path.open("w") as f:
        conf.write(f)
    return path


def ctl(conf: Path, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(conf), *args],
                          capture_output=True, text=True, timeout=2 * PATIENCE).stdout


def running_pids(conf: Path) -> dict[str, str]:
    """Each RUNNING program's pid, from one `supervisorctl status`."""
    return dict(re.findall(r"^(\S+)\s+RUNNING\s+pid (\d+),", ctl(conf, "status"), re.MULTILINE))


def listens(pid: int, port: int) -> bool:
    with contextlib.suppress(psutil.Error):
        conns = psutil.Process(pid).net_connections("tcp")
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)
    return False


async def test_rolling_restart_of_each_process_under_traffic_loses_and_repeats_nothing(dbs, users, tmp_path):
    system = System(dbs, tmp_path, {"CHAT_RATE_LIMIT_PER_SECOND": "0", "CHAT_LOG_LEVEL": "WARNING"},
                    api_port=free_port(), daemon_port=free_port())
    conf = supervisor_config(tmp_path, system.env)
    supervisord = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(system.api_port, PATIENCE)
        wait_port(system.daemon_port, PATIENCE)
        system.wait_ready("api")
        system.wait_ready("daemon")
        await eventually(lambda: set(running_pids(conf)) == set(PROGRAMS), "every program RUNNING")

        receivers = [users(f"r{i}") for i in range(10)]
        inboxes = {r: Inbox() for r in receivers}
        tasks = [asyncio.create_task(listen(system.ws_url, system.token(r), None, lambda f: None,
                                            max_backoff=0.3, inbox=inboxes[r])) for r in receivers]
        await eventually(lambda: all(inboxes[r].hellos for r in receivers), "every receiver holding a cursor")
        expected: dict[str, set[int]] = {r: set() for r in receivers}
        alice = users("alice")

        restarts_done = asyncio.Event()
        retried: list[str] = []  # what a client saw before its retry got the answer
        stored = [0]

        async def traffic():
            # A new connection for every POST, so that each one meets whichever
            # listeners are there at that moment (a kept-alive one would not).
            async with httpx.AsyncClient(timeout=PATIENCE, limits=httpx.Limits(max_keepalive_connections=0)) as c:
                for i in range(3000):  # until the restarts are done; bounded
                    if restarts_done.is_set():
                        return
                    to = receivers[i % len(receivers)]
                    for _attempt in range(10):  # as a client should: same client_msg_id on 503 or a lost answer
                        try:
                            r = await post(system, alice, to, f"m{i}", f"roll-{i}", client=c)
                        except httpx.TransportError as exc:
                            retried.append(exc.__class__.__name__)
                            await asyncio.sleep(0.1)  # pacing: a client's back-off before its retry
                            continue
                        if r.status_code != 503:
                            break
                        retried.append("503")
                        await asyncio.sleep(float(r.headers["retry-after"]) / 4)  # pacing: as Retry-After asks
                    else:
                        pytest.fail(f"message {i} not stored after 10 attempts: {retried[-10:]}")
                    assert r.status_code in (200, 201), r.text
                    expected[to].add(int(r.json()["id"]))
                    stored[0] += 1
                    await asyncio.sleep(0.02)  # pacing: the traffic's rate

        async def more_stored(what: str) -> None:
            mark = stored[0]
            await eventually(lambda: sender.done() or stored[0] >= mark + BETWEEN_RESTARTS,
                             f"{BETWEEN_RESTARTS} messages stored {what}")
            assert not sender.done(), "the traffic ended before the restarts did"

        sender = asyncio.create_task(traffic())
        before = await asyncio.to_thread(running_pids, conf)
        for name in PROGRAMS:
            await more_stored(f"before the restart of {name}")
            out = await asyncio.to_thread(ctl, conf, "restart", name)
            assert "started" in out, out
            if name != "writer":
                # As the runbook says: the next one is restarted once this one
                # listens again. RUNNING only means alive for startsecs, and a
                # loaded machine can take longer than that to import and bind.
                pid = int((await asyncio.to_thread(running_pids, conf))[name])
                port = system.api_port if name.startswith("api") else system.daemon_port
                await eventually(lambda pid=pid, port=port: listens(pid, port),
                                 f"the restarted {name} listening on {port}")
        await more_stored("through the restarted writer")
        restarts_done.set()
        await sender
        after = await asyncio.to_thread(running_pids, conf)
        assert all(before[name] != after[name] for name in PROGRAMS), (before, after)  # each one really restarted
        # One API process listens while the other restarts, and POSTs wait for
        # a restarting writer: no POST was refused for want of a listener. A
        # connection the kernel had queued for the one closing can still be
        # reset (rare; none in 8 runs): the retry answers it.
        assert "ConnectError" not in retried, retried
        assert set(retried) <= {"ReadError", "RemoteProtocolError", "503"} and len(retried) <= 2, retried

        def missing() -> dict[str, list[int]]:
            return {r: sorted(expected[r] - inboxes[r].seen) for r in receivers if expected[r] - inboxes[r].seen}

        try:
            await eventually(lambda: not missing(), "every stored message delivered")
        except TimeoutError:
            pytest.fail(f"not delivered: {missing()}; logs in {tmp_path}")
        for r in receivers:
            assert inboxes[r].duplicates == 0
            assert inboxes[r].ids == sorted(inboxes[r].ids)
            assert set(inboxes[r].ids) == expected[r]
        assert sum(len(h) for i in inboxes.values() for h in [i.hellos]) > len(receivers)  # they did reconnect
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        supervisord.terminate()
        supervisord.wait(2 * PATIENCE)
