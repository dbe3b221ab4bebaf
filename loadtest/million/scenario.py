"""Many authenticated WebSocket connections on this one box, load clients
included: `python -m loadtest.million --target 1000000`.

A private MariaDB and FerretDB, the deployed path (API -> writer -> MySQL ->
FerretDB -> oplog -> relay -> daemons), ``--daemons`` daemon processes on
the one SO_REUSEPORT port, and load processes (``--client go``: the compiled
``loadtest/clients/go``; ``--client python``: the lean ``loadtest.clients.million``),
each under the 20,000 open files a process may have, each from its own
source address in 127.0.0.0/8. Connections ramp up in steps; before each
step MemAvailable must stay over ``--floor-gib`` once the step's connections
cost what the ones before did, or the run stops there and names that wall.
Then ``--rate`` messages/s go between random connected users for
``--seconds`` through the API, and one daemon is restarted meanwhile (its
clients reconnect with `since`). Every message must reach both users' sockets
exactly once. Writes loadtest/results/million-latest.json and a PNG.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson
import typer

from loadtest.clients import loadclient
from loadtest.million import kmem
from loadtest.common import machine
from loadtest import wsload
from harness.servers import ROOT, free_port, stop
from harness.system import System, databases, running_system
from loadtest.common.results import RESULTS

PER_CLIENT_PROCESS = 16_000  # sockets per load process: under the 20,000 open files, with room
PER_DAEMON = 17_000  # sockets per daemon, planned with one daemon down (restarting): under the 18,000 cap,
# with room for the hash's imbalance
# A ramp step that has not connected by then stops the ramp: a million's last steps are 250,000
# connections each, which at the 600-1,100/s measured at 100k on a shared box take 230-420 s.
STEP_SECONDS_MAX = 900.0
RESTART_SECONDS_MAX = 300.0  # the restarted daemon's clients not all back by then: no reconnect_seconds
# Small on purpose: catch-up reads the stores for a `since` older than the cache
# (daemon.catchup), so a smaller cache costs queries, never messages. 10,000 covers the
# 6,000 messages of a 60 s run at 100 msg/s, so the restart's catch-ups are served from memory.
DAEMON_ENV = {"CHAT_RATE_LIMIT_PER_SECOND": "0", "CHAT_LOG_LEVEL": "WARNING", "CHAT_MAX_CONNECTIONS": "18000",
              "CHAT_RECENT_CACHE_MAX": "10000", "CHAT_RECENT_CACHE_MAX_BYTES": str(8 << 20),
              "CHAT_WRITER_QUEUE_MAX": "50000"}

app = typer.Typer(add_completion=False)


def log(msg: str) -> None:
    print(f"[million] {msg}", flush=True)


CLIENTS = ("go", "python")


def source_of(index: int) -> str:
    """The load process's own source address: its ephemeral ports are its alone."""
    return f"127.0.{1 + index // 250}.{2 + index % 250}"


class LoadProcess:
    """One ``loadtest.clients.million`` process and its latest status line."""

    def __init__(self, index: int, size: int, system: System, tmp: Path):
        self.prefix, self.size = f"m{index}x", size
        self.record = tmp / f"{self.prefix}.json"
        host, port = "127.0.0.1", system.daemon_port
        self.proc = subprocess.Popen([sys.executable, "-m", "loadtest.clients.million", self.prefix, str(size), host,
                                      str(port), source_of(index)], cwd=ROOT, env=system.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        self.status: dict = {}
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.status = orjson.loads(line)
            if self.status.get("done"):
                self.done.set()
        self.done.set()

    def send(self, **cmd: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(cmd) + b"\n")
        self.proc.stdin.flush()

    def users(self, n: int) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(n)]

    def stop(self) -> None:
        self.send(stop=str(self.record))

    def frames(self) -> tuple[list[int], list[int]]:
        """Every message frame it read: the slot (the user's number) and the id, repeats included."""
        data = orjson.loads(self.record.read_bytes())
        return data["slots"], data["ids"]


# The Go client's pauses set to the Python client's: 0.1 s doubling to 2 s after a failure,
# up to 0.5 s after a close (``loadtest.clients.million.backoff``); 128 handshakes at once.
# Random local ports, from GO_SOURCES addresses a process: left to connect(), a process's retries
# got the ports its refused attempts had just freed, the same 4-tuples, so the same daemon of the
# SO_REUSEPORT group, and a restarted daemon's refusals went on for minutes (100k: 94,730 of
# them, 8,168 clients not back after 120 s). Four addresses keep a process's 16,000 ports at a
# seventh of each one's range, so a random port is seldom taken.
GO_PACING = ["-retry-base", "100ms", "-retry-max", "2s", "-reopen-min", "0s", "-reopen-max", "500ms",
             "-in-flight", "128", "-progress", "1s", "-random-ports"]
GO_SOURCES = 4


def go_status(progress: dict) -> dict:
    """The Go client's progress line under the names the ramp and the restart read (pure)."""
    return {"open": progress.get("open", 0), "target": progress.get("active", 0),
            "failed": progress.get("failures", 0), "refused": progress.get("refused", 0),
            "closed": progress.get("ended", 0), "back": progress.get("back", 0),
            "last_back": progress.get("last_back", 0.0), "received": progress.get("frames", 0),
            "waiting": progress.get("active", 0) - progress.get("open", 0), "timeouts": 0}


class GoLoadProcess:
    """One compiled load client (``loadtest/clients/go``) holding the same users, driven the
    same way: its devices are the users ``m{index}x{slot}``, a device's index its slot."""

    def __init__(self, index: int, size: int, system: System, tmp: Path, binary: Path):
        self.prefix, self.size = f"m{index}x", size
        self.record = tmp / f"{self.prefix}.frames"
        users = loadclient.write_users(tmp / f"{self.prefix}.users", self.users(size))
        opts = loadclient.Options("ours", f"ws://127.0.0.1:{system.daemon_port}", users, system.secret,
                                  sources=tuple(source_of(index * GO_SOURCES + k) for k in range(GO_SOURCES)),
                                  control=True, frames_out=self.record,
                                  progress_ms=1000, extra=GO_PACING)
        self.running = loadclient.Running(opts, binary, start_new_session=True)
        self.proc = self.running.proc
        self.done = threading.Event()
        self.result: dict = {}

    @property
    def status(self) -> dict:
        return go_status(self.running.latest)

    def send(self, **cmd: object) -> None:
        self.running.send(**cmd)

    def users(self, n: int) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(n)]

    def stop(self) -> None:
        """Ends it (its frames are written as it exits); ``done`` once it has."""
        def wait() -> None:
            try:
                self.result = self.running.stop(120)
            finally:
                self.done.set()
        threading.Thread(target=wait, daemon=True).start()

    def frames(self) -> tuple[list[int], list[int]]:
        slots, ids = loadclient.read_frames(self.record)
        return slots.tolist(), ids.tolist()


def load_process(client: str, index: int, size: int, system: System, tmp: Path) -> LoadProcess | GoLoadProcess:
    if client == "go":
        return GoLoadProcess(index, size, system, tmp, loadclient.install())
    return LoadProcess(index, size, system, tmp)


Loaders = list[LoadProcess] | list[GoLoadProcess] | list[LoadProcess | GoLoadProcess]


def total(clients: Loaders, key: str) -> int:
    return sum(c.status.get(key, 0) for c in clients)


def start_daemons(system: System, count: int) -> None:
    """Starts them all at once (their imports share the cores), then waits
    for each one's own metrics port: past it, the daemon listens."""
    ports = {}
    for i in range(count):
        ports[f"daemon_{i}"] = start_daemon(system, f"daemon_{i}")
    for name, port in ports.items():
        wait_http(f"http://127.0.0.1:{port}/metrics", 120, system.procs[name])


METRICS_PORTS: dict[str, int] = {}
COUNTED = ("chat_daemon_catchup", "chat_daemon_rejects_total", "chat_daemon_closes_total")


def daemon_metrics(system: System) -> dict[str, float]:
    """The daemons' catch-up, refusal and close counters, summed."""
    out: dict[str, float] = {}
    for port in METRICS_PORTS.values():
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        for line in text.splitlines():
            if line.startswith(COUNTED) and "_created" not in line:
                key, _, value = line.rpartition(" ")
                out[key] = out.get(key, 0.0) + float(value)
    return out


def start_daemon(system: System, name: str) -> int:
    port = METRICS_PORTS[name] = free_port()
    out = open(system.logdir / f"{name}.log", "ab")
    system.procs[name] = subprocess.Popen([sys.executable, "-m", "daemon"], cwd=ROOT, stdout=out, stderr=out,
                                          env={**system.env, "CHAT_METRICS_PORT": str(port)})
    return port


def wait_http(url: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(url)


def pss(pids: list[int]) -> int:
    """Bytes the processes cost the host: their own pages, and their share of
    those they share (with 60 daemons, the interpreter and libraries count once)."""
    out = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                out += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
        except (OSError, StopIteration):
            pass
    return out


def daemon_pids(system: System) -> list[int]:
    return [p.pid for n, p in system.procs.items() if n.startswith("daemon")]


def step_sample(system: System, clients: Loaders, held: int) -> dict:
    mem = kmem.sample()
    daemons, loaders = pss(daemon_pids(system)), pss([c.proc.pid for c in clients])
    out = {"held": held, "slab_gib": kmem.gib(mem["meminfo"]["Slab"]), "daemons_gib": kmem.gib(daemons),
           "clients_gib": kmem.gib(loaders), "available_gib": kmem.gib(mem["meminfo"]["MemAvailable"]),
           "daemons_bytes": daemons, "clients_bytes": loaders, "mem": mem}
    go = [c.running.latest.get("mem_kb") or {} for c in clients if isinstance(c, GoLoadProcess)]
    if go:  # the Go runtime's own account: live objects, stacks, and free pages not yet given back
        out["clients_go_mb"] = {k: round(sum(m.get(k, 0) for m in go) / 1024, 1) for k in go[0]}
    return out


def accounted(s: dict) -> int:
    """The memory the connections can take: the kernel's slab, page tables and
    TCP buffers, and the daemons' and load processes' PSS."""
    info = s["mem"]["meminfo"]
    return info["Slab"] + info["PageTables"] + info["TcpBuffers"] + s["daemons_bytes"] + s["clients_bytes"]


def next_step_fits(last: dict, first: dict, want: int, floor: int, margin: float = 1.15) -> tuple[bool, str]:
    """Whether ``want`` connections leave MemAvailable over ``floor``, if each
    new one costs what those since ``first`` did, and ``margin`` times it
    (pure: the ramp's decision). What the connections cost is summed from its
    parts, not read off MemAvailable, which also moves with the page cache
    and with whatever else runs on the box."""
    held = last["held"] - first["held"]
    if held <= 0:
        return True, ""
    per_conn = margin * (accounted(last) - accounted(first)) / held
    left = last["mem"]["meminfo"]["MemAvailable"] - per_conn * (want - last["held"])
    if left < floor:
        return False, (f"MemAvailable would fall to {kmem.gib(left)} GiB (under {kmem.gib(floor)}) at {want} "
                       f"connections: {round(per_conn / 1024, 2)} KB per connection, both ends and all processes")
    return True, ""


def ramp(system: System, clients: Loaders, target: int, steps: list[float], floor: int,
         samples: list[dict], budget: float) -> tuple[int, str | None, float]:
    """Connects in steps, within ``budget`` seconds; returns the connections
    held, the wall met (None if none) and the connections per second of the last step."""
    rate, wall = 0.0, None
    deadline = time.monotonic() + budget
    for fraction in steps:
        want = int(target * fraction)
        fits, why = next_step_fits(samples[-1], samples[0], want, floor)
        if not fits:
            return samples[-1]["held"], why, rate
        per = -(-want // len(clients))
        start, before = time.monotonic(), total(clients, "open")
        for c in clients:
            c.send(target=min(per, c.size))
        want = sum(min(per, c.size) for c in clients)
        last_report = 0.0
        while total(clients, "open") < want:
            if time.monotonic() - start > STEP_SECONDS_MAX or time.monotonic() > deadline:
                wall = (f"connect rate: {total(clients, 'open')} of {want} open after {time.monotonic() - start:.0f} s "
                        f"of the step, the ramp's {budget:.0f} s spent")
                break
            available = kmem.parse_meminfo(Path("/proc/meminfo").read_text())["MemAvailable"]
            if available < floor * 2 // 3:
                wall = f"MemAvailable fell to {kmem.gib(available)} GiB during the step to {want}"
                break
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                log(f"  {total(clients, 'open')}/{want} open, {total(clients, 'refused')} refused (503), "
                    f"{total(clients, 'failed')} failed, MemAvailable {kmem.gib(available)} GiB")
            time.sleep(0.5)
        seconds = time.monotonic() - start
        held = total(clients, "open")
        rate = round((held - before) / seconds, 1)
        time.sleep(2)  # the daemons' and clients' allocations settle
        samples.append(step_sample(system, clients, held))
        s = samples[-1]
        log(f"step {fraction:g}: {held} held in {seconds:.1f} s ({rate}/s); slab {s['slab_gib']} GiB, daemons "
            f"{s['daemons_gib']} GiB, clients {s['clients_gib']} GiB {s.get('clients_go_mb', '')}, MemAvailable "
            f"{s['available_gib']} GiB")
        if wall:
            return held, wall, rate
    return samples[-1]["held"], None, rate


def restart_one(system: System, clients: Loaders, at: float, out: dict) -> None:
    """SIGTERM to one daemon, then starts it again; its clients reconnect with
    `since`. Measures the seconds from the SIGTERM until every one is back."""
    time.sleep(at)
    proc = system.procs.pop("daemon_0")
    sockets = len(os.listdir(f"/proc/{proc.pid}/fd"))
    closed_before = total(clients, "closed")
    mark = time.time()
    for c in clients:
        c.send(mark=mark)
    proc.terminate()
    stop(proc)
    out["restart_drain_seconds"] = round(time.time() - mark, 2)  # SIGTERM to exit: its drain
    start_daemon(system, "daemon_0")
    deadline = time.monotonic() + RESTART_SECONDS_MAX
    # seconds since the SIGTERM, then clients closed, back and refused so far: where the time goes
    timeline = out["restart_timeline"] = []
    time.sleep(1.5)
    while time.monotonic() < deadline:
        closed = total(clients, "closed") - closed_before
        if not timeline or time.time() - mark - timeline[-1][0] >= 2:
            timeline.append([round(time.time() - mark, 1), closed, total(clients, "back"), total(clients, "refused")])
        if total(clients, "back") >= closed and total(clients, "open") >= out["held"]:
            break
        time.sleep(0.5)
    closed = total(clients, "closed") - closed_before
    back = max((c.status.get("last_back", 0.0) for c in clients), default=0.0)
    out.update(restart_closed=closed, restart_fds=sockets, restart_back=total(clients, "back"),
               reconnect_seconds=round(back - mark, 2) if back and total(clients, "back") >= closed else None)
    out["restart_clients"] = {k: total(clients, k) for k in ("failed", "refused", "timeouts", "waiting")}
    out["restart_metrics"] = daemon_metrics(system)
    log(f"restart: {closed} clients closed with 1012, all back in {out['reconnect_seconds']} s; "
        f"{out['restart_clients']}, daemons: {out['restart_metrics']}")


def verify(clients: Loaders, expected: dict[str, list[int]]) -> tuple[int, int, int, list[str]]:
    """Lost and duplicated (user, id) pairs, frames received, from every client's record, and
    the first lost pairs by name (to look for in the daemons' logs)."""
    got: dict[str, list[int]] = {}
    for c in clients:
        for slot, msg_id in zip(*c.frames(), strict=True):
            got.setdefault(f"{c.prefix}{slot}", []).append(msg_id)
    lost = dup = 0
    named: list[str] = []
    for user, ids in expected.items():
        seen = got.pop(user, [])
        missing = set(ids) - set(seen)
        lost += len(missing)
        named += [f"{user} {i}" for i in sorted(missing)][:20 - len(named)]
        dup += len(seen) - len(set(seen))
    dup += sum(len(v) for v in got.values())  # frames nobody was sent: as wrong as a repeat
    return lost, dup, sum(len(v) for v in expected.values()), named


def run(target: int, daemons: int, rate: float, seconds: float, steps: list[float], floor_gib: float,
        env: dict[str, str], ramp_seconds: float = 1800.0, idle_seconds: float = 10.0, client: str = "go") -> dict:
    if client not in CLIENTS:
        raise ValueError(f"client is one of {CLIENTS}, got {client!r}")
    tmp = Path(tempfile.mkdtemp(prefix="million-"))
    result: dict = {"target": target, "daemons": daemons, "rate": rate, "seconds": seconds, "env": env,
                    "client": client}
    # Every parameter by name (api_port too): what the mapping holds can only be environment.
    with databases(tmp / "dbs") as dbs, running_system(dbs, daemons=0, apis=1, api_port=None, writer=True, relay=True,
                                                       **{**DAEMON_ENV, **env}) as system:
        before = kmem.sample()
        log(f"starting {daemons} daemons; MemAvailable {kmem.gib(before['meminfo']['MemAvailable'])} GiB")
        start_daemons(system, daemons)
        time.sleep(3)
        idle_pss = pss(daemon_pids(system))
        result["daemon_idle_pss_mb"] = round(idle_pss / daemons / 2**20, 1)
        count = max(1, -(-target // PER_CLIENT_PROCESS))
        sizes = [target // count + (i < target % count) for i in range(count)]
        clients = [load_process(client, i, n, system, tmp) for i, n in enumerate(sizes)]
        try:
            time.sleep(2)
            samples = [step_sample(system, clients, 0)]
            result["client_idle_pss_mb"] = round(samples[0]["clients_bytes"] / count / 2**20, 1)
            log(f"daemon idle PSS {result['daemon_idle_pss_mb']} MB, client process idle PSS "
                f"{result['client_idle_pss_mb']} MB, {count} client processes")
            client_pids = [c.proc.pid for c in clients]
            daemon_cpu, client_cpu = machine.ProcessCpu(daemon_pids(system)), machine.ProcessCpu(client_pids)
            held, wall, connect_rate = ramp(system, clients, target, steps, int(floor_gib * 2**30), samples,
                                             ramp_seconds)
            result["cpu_us_per_connect"] = {"daemons": round(daemon_cpu.seconds() / max(1, held) * 1e6),
                                            "clients": round(client_cpu.seconds() / max(1, held) * 1e6)}
            first, last = samples[0], samples[-1]
            idle = machine.CpuWindow()
            daemon_cpu, client_cpu = machine.ProcessCpu(daemon_pids(system)), machine.ProcessCpu(client_pids)
            time.sleep(idle_seconds)
            # holding only: heartbeats and pings (the host's share includes whatever else runs on the box)
            result["idle_cpu"] = {"host": idle.result(), "daemon_cores": daemon_cpu.cores(),
                                  "client_cores": client_cpu.cores()}
            result["per_daemon_sockets"] = sorted(len(os.listdir(f"/proc/{pid}/fd")) for pid in daemon_pids(system))
            log(f"holding: {result['idle_cpu']}; sockets per daemon {result['per_daemon_sockets'][0]}.."
                f"{result['per_daemon_sockets'][-1]}")
            result.update(held=held, client_processes=count, connect_per_s=connect_rate, steps=[
                {k: v for k, v in s.items() if k != "mem"} for s in samples])
            if wall:
                result["wall"] = wall
            n = max(1, last["held"])
            result["daemon_kb_per_conn"] = round((last["daemons_bytes"] - first["daemons_bytes"]) / n / 1024, 2)
            result["client_kb_per_conn"] = round((last["clients_bytes"] - first["clients_bytes"]) / n / 1024, 2)
            kernel = kmem.per_socket(first["mem"], last["mem"], 2 * n)
            result["kernel_kb_per_socket"] = kernel.get("Slab")
            result["kernel_per_socket_kb"] = kernel
            result["host_kb_per_conn"] = round((first["mem"]["meminfo"]["MemAvailable"]
                                                - last["mem"]["meminfo"]["MemAvailable"]) / n / 1024, 2)
            result["accounted_kb_per_conn"] = round((accounted(last) - accounted(first)) / n / 1024, 2)
            result["meminfo"] = {"before": before["meminfo"], "idle": first["mem"]["meminfo"],
                                 "after": last["mem"]["meminfo"]}
            users = [u for c in clients for u in c.users(c.status.get("target", 0))]
            log(f"{held} held; sending {rate} msg/s for {seconds} s between random users, restarting a daemon")
            restarter = threading.Thread(target=restart_one, args=(system, clients, seconds / 3, result))
            host = machine.CpuWindow()
            restarter.start()
            expected, creation, errors, refused = asyncio.run(
                wsload._send(system.api_url, system.secret, users, rate, seconds, False))
            result["host_cpu"] = host.result()
            restarter.join(RESTART_SECONDS_MAX + 120)
            want, last_seen, still = sum(len(v) for v in expected.values()), -1, time.monotonic()
            while total(clients, "received") < want and time.monotonic() - still < 20:
                if total(clients, "received") != last_seen:
                    last_seen, still = total(clients, "received"), time.monotonic()
                time.sleep(0.5)
            for c in clients:
                c.stop()
            for c in clients:
                c.done.wait(120)
            lost, dup, frames, result["lost_first"] = verify(clients, expected)
            result.update(sent=len(creation), asked=int(rate * seconds), send_errors=errors, refused=len(refused),
                          expected_frames=frames, lost=lost, duplicated=dup,
                          creation_ms=wsload.percentiles(creation))
            log(f"{len(creation)} messages sent, {frames} frames expected: {lost} lost, {dup} duplicated")
        finally:
            # SIGKILL: the kernel closes the sockets; a drain would send a million close frames first
            for proc in [c.proc for c in clients] + [system.procs.pop(n) for n in list(system.procs)
                                                     if n.startswith("daemon")]:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
    return result


def publish(result: dict, out: Path) -> None:
    result["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                      cwd=ROOT).stdout.strip()
    result["machine"] = machine.describe()
    result["where"] = (f"{result['daemons']} daemons, {result.get('client_processes')} load processes, FerretDB 1.24 "
                       "(SQLite) and MariaDB 10.11, all on one 2-core 24 GiB box over loopback")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    if result.get("steps"):
        kmem.plot(result["steps"], out.with_suffix(".png"), result["where"])
    log(f"wrote {out}")


def check(result: dict) -> str | None:
    """Why the run failed, or None: a message lost or repeated, connections
    not held short of a named wall, or messages asked for and not stored."""
    if result.get("lost") or result.get("duplicated"):
        return f"{result['lost']} lost, {result['duplicated']} duplicated"
    if result["held"] < result["target"] and not result.get("wall"):
        return f"{result['held']} of {result['target']} held, no wall named"
    if result.get("sent", 0) < result.get("asked", 0) or result.get("refused"):
        return f"{result.get('sent')} of {result.get('asked')} messages stored"
    if result.get("reconnect_seconds") is None:
        return "the restarted daemon's clients did not all come back"
    return None


@app.command()
def main(target: int = typer.Option(1_000_000, help="connections to hold"),
         daemons: int = typer.Option(0, help="daemon processes (0: one per 17,000 connections, and one more)"),
         rate: float = typer.Option(100.0, help="messages/s through the API once connected"),
         seconds: float = typer.Option(60.0, help="how long messages are sent"),
         steps: str = typer.Option("0.1,0.25,0.5,0.75,1", help="ramp steps, as fractions of the target"),
         floor_gib: float = typer.Option(1.5, help="MemAvailable the ramp keeps, GiB"),
         ping_seconds: float = typer.Option(20.0, help="CHAT_PING_INTERVAL_SECONDS of the daemons"),
         ramp_seconds: float = typer.Option(1800.0, help="the ramp stops here, and names the connect rate its wall"),
         client: str = typer.Option("go", help="the load processes: go (loadtest/clients/go) or python "
                                    "(loadtest.clients.million)"),
         setting: list[str] = typer.Option([], "--set", help="KEY=VALUE: a setting of every process, kept in the "
                                           "result (e.g. CHAT_PRESENCE_ENABLED=false)"),
         out: Path = typer.Option(RESULTS / "million-latest.json")) -> None:
    daemons = daemons or 1 + -(-target // PER_DAEMON)
    env = {"CHAT_PING_INTERVAL_SECONDS": f"{ping_seconds:g}", **dict(kv.split("=", 1) for kv in setting)}
    result = run(target, daemons, rate, seconds, [float(s) for s in steps.split(",")], floor_gib, env,
                 ramp_seconds, client=client)
    publish(result, out)
    failed = check(result)
    if failed:
        raise SystemExit(f"FAILED million: {failed}")
