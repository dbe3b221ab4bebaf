"""The compiled load client (``loadtest/clients/go``, built by ``scripts/install-loadclient.sh``)
from Python: its command line, its progress and result read back, and its result in the shape
the peers run reads the Python clients' tallies in.

One ``loadclient`` process holds every connection of a side: its CPU per frame is what the
kernel costs and little more, where a Python client's is about the server's own
(docs/benchmarks.md, Beside Centrifugo). The binary speaks both servers' protocols through the
same read loop and accounting; see its main.go.

Parsing is pure (tested in tests/core/test_loadclient.py); ``Running`` is the process.
"""

from __future__ import annotations

import functools
import math
import signal
import subprocess
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from harness.servers import ROOT

INSTALL = ROOT / "scripts" / "install-loadclient.sh"
PROTOCOLS = ("ours", "centrifugo")


@functools.cache
def install() -> Path:
    """The binary built from this checkout's sources, built first if it is not yet (the path
    has their hash: checkouts sharing .cache do not run each other's)."""
    out = subprocess.run([str(INSTALL)], check=True, stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


@dataclass
class Options:
    """What one loadclient process is told: ``users`` is a file of a user per line (a
    connection each: a user's devices are its lines), ``expect`` one of 'user count' lines."""
    protocol: str
    url: str
    users: Path
    secret: str
    sources: Sequence[str] = ()
    expect: Path | None = None
    until_complete: bool = False
    max_seconds: float = 0.0
    ids_out: Path | None = None  # each first arrival's id (int64) and latency (float32 ms) beside it
    progress_ms: int = 200
    per_device: bool = False
    # Driven over stdin ({"target": n}, {"mark": t}; ``Running.send``) rather than every device at once
    control: bool = False
    frames_out: Path | None = None  # every message frame, repeats included (``read_frames``)
    extra: list[str] = field(default_factory=list)


def command(opts: Options, binary: Path | None = None) -> list[str]:
    if opts.protocol not in PROTOCOLS:
        raise ValueError(f"protocol is one of {PROTOCOLS}, got {opts.protocol!r}")
    cmd = [str(binary or install()), "-protocol", opts.protocol, "-url", opts.url, "-users", str(opts.users),
           "-secret", opts.secret, "-progress", f"{opts.progress_ms}ms"]
    if opts.sources:
        cmd += ["-sources", ",".join(opts.sources)]
    if opts.expect is not None:
        cmd += ["-expect", str(opts.expect)]
    if opts.until_complete:
        cmd.append("-until-complete")
    if opts.max_seconds:
        cmd += ["-max-seconds", f"{opts.max_seconds:g}"]
    if opts.ids_out is not None:
        ids, lat = tally_paths(opts.ids_out)
        cmd += ["-ids-out", str(ids), "-lat-out", str(lat)]
    if opts.per_device:
        cmd.append("-per-device")
    if opts.control:
        cmd.append("-control")
    if opts.frames_out is not None:
        cmd += ["-frames-out", str(opts.frames_out)]
    return cmd + opts.extra


def tally_paths(base: Path) -> tuple[Path, Path]:
    """Where the first arrivals go: ids beside latencies, as ``loadtest.clients.peers.read_tally`` names them."""
    return base.with_suffix(".ids"), base.with_suffix(".lat")


def owed(users: Iterable[str], recipient_of: Iterable[int], prefix: str = "p") -> dict[str, int]:
    """Messages owed to each device of each user, when message i goes to user
    ``prefix + str(recipient_of[i])`` (``loadtest.peers.feeder.recipients``)."""
    counts = Counter(recipient_of)
    return {u: counts.get(int(u.removeprefix(prefix)), 0) for u in dict.fromkeys(users)}


def write_users(path: Path, users: Iterable[str]) -> Path:
    path.write_text("".join(f"{u}\n" for u in users))
    return path


def write_expect(path: Path, counts: dict[str, int]) -> Path:
    path.write_text("".join(f"{u} {n}\n" for u, n in counts.items()))
    return path


def progress(line: bytes) -> dict | None:
    """A progress line of the client's stderr, or None for anything else it printed."""
    line = line.strip()
    if not line.startswith(b"{"):
        return None
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and "connected" in doc else None


def result(stdout: bytes) -> dict:
    """The result object, the last line of its stdout."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("the load client printed no result")
    doc = orjson.loads(lines[-1])
    if not isinstance(doc, dict) or doc.get("client") != "go":
        raise ValueError(f"not a load client result: {lines[-1][:200]!r}")
    return doc


def peer_tally(res: dict) -> dict:
    """The result as ``loadtest.clients.peers`` writes a client process's tally, with the
    client's own counts beside it (lost per device needs ``expect``; else None)."""
    return {"duplicates": res["duplicated"], "frames": res["frames"], "reconnects": res["reconnects"],
            "connect_failures": res["connect_failures"], "close_codes": dict(res["close_codes"] or {}),
            "lost": res["lost"], "received": res["received"], "devices_with_loss": res["devices_with_loss"],
            "client_cpu_seconds": round(sum(res["cpu_seconds"].values()), 3),
            "client_cpu_us_per_frame": res["cpu_us_per_frame"], "client_max_rss_kb": res["max_rss_kb"],
            # how many frames a read and a wake-up carried: what the kernel's cost per frame depends on
            "client_frames_per_read": ratio(res["frames"], res.get("reads")),
            "client_frames_per_wake": ratio(res["frames"], res.get("wakes"))}


def ratio(a: float, b: float | None) -> float | None:
    return round(a / b, 2) if b else None


def read_arrivals(base: Path) -> tuple[array, array]:
    """The first arrivals' ids and latencies (ms; NaN where a frame carried no send time)."""
    ids_path, lat_path = tally_paths(base)
    ids, lat = array("q"), array("f")
    ids.frombytes(ids_path.read_bytes())
    lat.frombytes(lat_path.read_bytes())
    if len(ids) != len(lat):
        raise ValueError(f"{len(ids)} ids but {len(lat)} latencies in {base}")
    return ids, lat


def read_frames(path: Path) -> tuple[array, array]:
    """Every message frame a client read (``frames_out``): the device's index (its line in the
    users file) beside the message's id, repeats included."""
    pairs = array("q")
    pairs.frombytes(path.read_bytes())
    return pairs[0::2], pairs[1::2]


def timed(ids: array, lat: array) -> tuple[array, array]:
    """Only the arrivals that carried a send time."""
    keep = [i for i, v in enumerate(lat) if not math.isnan(v)]
    return array("q", (ids[i] for i in keep)), array("f", (lat[i] for i in keep))


class Running:
    """One loadclient process: its progress lines read from stderr as they come (anything
    else it prints goes on to ours), its result read at its end."""

    def __init__(self, opts: Options, binary: Path | None = None, **popen: object):
        self.opts = opts
        stdin = subprocess.PIPE if opts.control else subprocess.DEVNULL
        self.proc = subprocess.Popen(command(opts, binary), stdin=stdin, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, **popen)  # type: ignore[call-overload]
        self.latest: dict = {}
        self.history: list[dict] = []  # every progress line: the client's own CPU and frames over time
        self._out = b""
        # Both pipes read as they fill: a large result (every device's counts) must not block the client.
        self._readers = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._read_out, daemon=True)]
        for t in self._readers:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self._out = self.proc.stdout.read()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            doc = progress(line)
            if doc is None:
                sys.stderr.buffer.write(line)
                sys.stderr.flush()
            else:
                self.latest = doc
                self.history.append(doc)

    def send(self, **cmd: object) -> None:
        """One command, with ``control``: ``target=n`` (the first n devices hold a connection),
        ``mark=t`` (opens from now on count as ``back``)."""
        assert self.proc.stdin is not None, "a command needs Options.control"
        self.proc.stdin.write(orjson.dumps(cmd) + b"\n")
        self.proc.stdin.flush()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def connected(self) -> int:
        return int(self.latest.get("connected", 0))

    def frames(self) -> int:
        return int(self.latest.get("frames", 0))

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def stop(self, timeout: float = 60) -> dict:
        """Told to end (SIGTERM), then its result."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float | None = None) -> dict:
        """Its result once it has ended by itself (``until_complete``, ``max_seconds``) or been told to."""
        self.proc.wait(timeout)
        for t in self._readers:
            t.join()  # the pipes close with the process
        if self.proc.returncode != 0:
            raise RuntimeError(f"loadclient exited with {self.proc.returncode}")
        return result(self._out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def own_cpu_per_frame(history: list[dict], start: float, end: float) -> float | None:
    """The client's CPU µs per frame between two wall-clock times, from its own progress lines
    (getrusage, to the µs: finer than /proc's 10 ms ticks over a step of a few seconds): the
    first and last lines inside the window, its CPU over the frames it read meanwhile."""
    inside = [h for h in history if "t" in h and start <= h["t"] <= end]
    if len(inside) < 2:
        return None
    frames = inside[-1]["frames"] - inside[0]["frames"]
    if frames <= 0:
        return None
    return round((inside[-1]["cpu_seconds"] - inside[0]["cpu_seconds"]) / frames * 1e6, 2)
