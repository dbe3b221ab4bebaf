"""The Python side of the compiled load client: its command line, its progress and result
lines read back, what each device is owed, and its first arrivals as the peers run reads them."""

import math
from array import array
from pathlib import Path

import orjson
import pytest

from loadtest.clients import loadclient
from loadtest.peers.feeder import recipients

# A result as loadclient prints it (the keys the Python side reads, and a few more).
RESULT = {"client": "go", "protocol": "centrifugo", "ended_by": "signal", "connections": 3, "connected": 3,
          "open_at_end": 3, "frames": 12, "received": 10, "duplicated": 2, "lost": 1, "unexpected": 0,
          "complete": False, "devices_with_loss": 1, "devices_with_duplicates": 1, "reconnects": 1,
          "connect_failures": 4, "close_codes": {"1001": 1}, "cpu_seconds": {"user": 0.002, "system": 0.004},
          "cpu_us_per_frame": 500.0, "max_rss_kb": 9000, "wall_seconds": 3.2, "reads": 6, "wakes": 3,
          "latency_ms": {"count": 10, "p50": 1.2, "p90": 2.0, "p99": 3.1, "p999": 3.1, "max": 3.1,
                         "buckets_le_ms": [[1.2, 6], [3.1, 4]]},
          "devices": [{"user": "p1", "received": 2, "duplicated": 2, "lost": 1, "owed": 3}]}


def test_the_command_line_names_every_option_given(tmp_path: Path):
    opts = loadclient.Options("ours", "ws://127.0.0.1:9", tmp_path / "u.txt", "s3cret", sources=("127.0.0.2",),
                              expect=tmp_path / "e.txt", until_complete=True, max_seconds=30,
                              ids_out=tmp_path / "run.json", per_device=True)
    cmd = loadclient.command(opts, Path("/bin/loadclient"))
    assert cmd[:5] == ["/bin/loadclient", "-protocol", "ours", "-url", "ws://127.0.0.1:9"]
    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert (value("-secret"), value("-sources"), value("-max-seconds")) == ("s3cret", "127.0.0.2", "30")
    assert (value("-ids-out"), value("-lat-out")) == (str(tmp_path / "run.ids"), str(tmp_path / "run.lat"))
    assert "-until-complete" in cmd and "-per-device" in cmd
    bare = loadclient.command(loadclient.Options("centrifugo", "ws://h:1", Path("u"), "k"), Path("b"))
    assert not {"-expect", "-until-complete", "-ids-out", "-sources", "-max-seconds"} & set(bare)
    with pytest.raises(ValueError):
        loadclient.command(loadclient.Options("mqtt", "ws://h:1", Path("u"), "k"))


def test_progress_lines_are_told_from_anything_else_on_stderr():
    assert loadclient.progress(b'{"seconds":1.5,"connected":7,"open":7,"frames":40}\n')["connected"] == 7
    for other in (b"loadclient: -url and -users are required\n", b"{not json\n", b'{"level":"warn"}\n', b"\n"):
        assert loadclient.progress(other) is None


def test_the_result_is_the_last_line_and_becomes_a_peers_tally():
    res = loadclient.result(b"\n" + orjson.dumps(RESULT) + b"\n")
    tally = loadclient.peer_tally(res)
    # the keys loadtest.peers.scenario sums over the Python clients' tallies
    assert (tally["duplicates"], tally["frames"], tally["reconnects"], tally["connect_failures"]) == (2, 12, 1, 4)
    assert tally["close_codes"] == {"1001": 1}
    assert (tally["lost"], tally["client_cpu_seconds"], tally["client_cpu_us_per_frame"]) == (1, 0.006, 500.0)
    assert (tally["client_frames_per_read"], tally["client_frames_per_wake"]) == (2.0, 4.0)
    assert loadclient.peer_tally({**res, "reads": 0})["client_frames_per_read"] is None
    with pytest.raises(ValueError, match="no result"):
        loadclient.result(b"")
    with pytest.raises(ValueError, match="not a load client result"):
        loadclient.result(b'{"connected": 1}')


def test_each_device_is_owed_its_users_messages():
    to = recipients(4, 100)
    owed = loadclient.owed(["p0", "p1", "p1", "p2", "p3"], to)
    assert list(owed) == ["p0", "p1", "p2", "p3"]  # a user once, however many devices it has
    assert sum(owed.values()) == 100 and owed["p1"] == to.count(1)


def test_users_and_expectations_are_written_a_line_each(tmp_path: Path):
    users = loadclient.write_users(tmp_path / "u.txt", ["p0", "p0", "p1"])
    assert users.read_text() == "p0\np0\np1\n"
    expect = loadclient.write_expect(tmp_path / "e.txt", {"p0": 3, "p1": 0})
    assert expect.read_text() == "p0 3\np1 0\n"


def test_first_arrivals_read_back_as_the_python_clients_write_them(tmp_path: Path):
    ids_path, lat_path = loadclient.tally_paths(tmp_path / "c0.json")
    ids_path.write_bytes(array("q", [3, 9, 12]).tobytes())
    lat_path.write_bytes(array("f", [1.5, math.nan, 4.0]).tobytes())
    ids, lat = loadclient.read_arrivals(tmp_path / "c0.json")
    assert list(ids) == [3, 9, 12] and lat[0] == 1.5 and math.isnan(lat[1])
    kept_ids, kept_lat = loadclient.timed(ids, lat)
    assert list(kept_ids) == [3, 12] and list(kept_lat) == [1.5, 4.0]
    lat_path.write_bytes(array("f", [1.0]).tobytes())
    with pytest.raises(ValueError, match="3 ids but 1 latencies"):
        loadclient.read_arrivals(tmp_path / "c0.json")


def test_the_clients_own_cpu_per_frame_is_read_from_its_progress_lines_inside_a_window():
    history = [{"t": 10.0, "cpu_seconds": 1.0, "frames": 0, "connected": 2},
               {"t": 11.0, "cpu_seconds": 1.1, "frames": 10_000, "connected": 2},
               {"t": 12.0, "cpu_seconds": 1.3, "frames": 20_000, "connected": 2},
               {"t": 13.0, "cpu_seconds": 1.3, "frames": 20_000, "connected": 2}]
    assert loadclient.own_cpu_per_frame(history, 10.5, 12.5) == 20.0  # 0.2 s over 10,000 frames
    assert loadclient.own_cpu_per_frame(history, 10.5, 11.5) is None  # one line inside: nothing to measure
    assert loadclient.own_cpu_per_frame(history, 12.5, 13.5) is None  # no frames in it


def test_a_driven_client_says_so_and_names_where_its_frames_go(tmp_path: Path):
    opts = loadclient.Options("ours", "ws://127.0.0.1:9", tmp_path / "u.txt", "s3cret", control=True,
                              frames_out=tmp_path / "m0x.frames")
    cmd = loadclient.command(opts, Path("/bin/loadclient"))
    assert "-control" in cmd and cmd[cmd.index("-frames-out") + 1] == str(tmp_path / "m0x.frames")
    bare = loadclient.command(loadclient.Options("ours", "ws://h:1", Path("u"), "k"), Path("b"))
    assert not {"-control", "-frames-out"} & set(bare)


def test_every_frame_read_back_with_its_device_repeats_included(tmp_path: Path):
    # (device, id) as the client writes them: two int64 each
    (tmp_path / "f").write_bytes(array("q", [0, 11, 2, 11, 2, 11, 5, 40]).tobytes())
    devices, ids = loadclient.read_frames(tmp_path / "f")
    assert (devices.tolist(), ids.tolist()) == ([0, 2, 2, 5], [11, 11, 11, 40])
