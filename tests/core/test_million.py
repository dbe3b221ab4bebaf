"""The million-connection bench's decisions and its lean client's wire, without I/O."""

from __future__ import annotations

import random

from chat import auth
from loadtest.million import kmem
from loadtest.million.scenario import go_status, next_step_fits
from loadtest.clients.million import backoff, mint

SECRET = "test-secret-0123456789abcdef0123456789"


def test_its_tokens_are_what_the_daemon_verifies() -> None:
    user, expires = auth.verify_until(SECRET, mint(SECRET.encode(), "m3x17", 600))
    assert user == "m3x17" and expires > 0


def test_a_token_signed_with_another_secret_is_refused() -> None:
    try:
        auth.verify_until(SECRET, mint(b"another-secret-0123456789abcdef01234", "m3x17", 600))
    except auth.AuthError:
        return
    raise AssertionError("a forged token was accepted")


def test_backoff_doubles_to_two_seconds_jittered() -> None:
    rng = random.Random(1)
    assert all(0.05 <= backoff(0, rng) <= 0.15 for _ in range(100))
    assert all(1.0 <= backoff(9, rng) <= 3.0 for _ in range(100))


def _sample(held: int, available_gib: float, used_gib: float) -> dict:
    info = {"MemAvailable": int(available_gib * 2**30), "Slab": int(used_gib * 2**30), "PageTables": 0,
            "TcpBuffers": 0}
    return {"held": held, "daemons_bytes": 0, "clients_bytes": 0, "mem": {"meminfo": info}}


def test_the_ramp_stops_where_memory_would_run_short() -> None:
    first = _sample(0, 20.0, 1.0)
    last = _sample(100_000, 18.8, 2.2)  # 1.2 GiB for 100k: ~12.6 KB each
    fits, _ = next_step_fits(last, first, 1_000_000, int(1.5 * 2**30))
    assert fits  # 18.8 - 1.15 * 10.8 = 6.4 GiB left
    fits, why = next_step_fits(last, first, 1_500_000, int(1.5 * 2**30))
    assert not fits and "1500000" in why


def test_kernel_bytes_per_socket_from_two_samples() -> None:
    before = {"meminfo": {"Slab": 0, "SUnreclaim": 0, "PageTables": 0, "TcpBuffers": 0}, "slabs": {"TCP": 0}}
    after = {"meminfo": {"Slab": 5 << 30, "SUnreclaim": 3 << 30, "PageTables": 0, "TcpBuffers": 0},
             "slabs": {"TCP": 2 << 30}}
    out = kmem.per_socket(before, after, 2 << 20)
    assert out["Slab"] == 2.5 and out["caches"]["TCP"] == 1.0
    assert kmem.parse_tcp_pages("TCP: inuse 5 orphan 0 tw 1 alloc 5 mem 238\n") == 238
    assert kmem.parse_slabinfo("slabinfo - version: 2.1\n# name ...\nTCP 10 12 2560 12 8 : x\n") == {"TCP": 25600}


def test_the_go_clients_progress_reads_as_the_python_clients_status() -> None:
    progress = {"connected": 90, "open": 80, "active": 100, "failures": 7, "refused": 5, "ended": 30, "back": 28,
                "last_back": 1700000000.5, "frames": 12, "received": 11}
    status = go_status(progress)
    # what the ramp, the restart and the wait for frames read: repeats count as received, as the Python client's
    opened = (status["open"], status["target"], status["waiting"], status["failed"], status["refused"])
    assert opened == (80, 100, 20, 7, 5)
    assert (status["closed"], status["back"], status["last_back"], status["received"]) == (30, 28, 1700000000.5, 12)
    assert go_status({})["open"] == 0
