"""The peers benchmark's pure parts: the schedule, who gets what, and the figures per step."""

from array import array

import pytest

from loadtest.peers import figures as pf
from loadtest.peers.centrifugo_feed import publications
from loadtest.peers.feeder import parse_steps, recipients, step_ranges, ticks


def test_a_schedule_is_rate_x_seconds_steps_and_their_ids_run_on_without_a_gap():
    steps = parse_steps("1000x2, 500x4")
    assert steps == [(1000.0, 2.0), (500.0, 4.0)]
    assert step_ranges(steps) == [(1, 2000), (2001, 4000)]
    for bad in ("1000", "0x2", "100x0", "x3"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_ticks_carry_what_10_ms_brings_and_add_up_to_the_step():
    assert list(ticks(1000, 25)) == [10, 10, 5]
    assert list(ticks(50, 3)) == [1, 1, 1]  # under one message per tick: one a tick
    assert sum(ticks(70_000, 280_000)) == 280_000


def test_both_feeds_send_each_message_to_the_same_recipient():
    to = recipients(100, 50)
    assert to == recipients(100, 50) and all(0 <= k < 100 for k in to)
    pubs = publications(3, 2, to, 12.5, "2026-01-01T00:00:00.000+00:00")
    assert [p["publish"]["channel"] for p in pubs] == [f"#p{to[2]}", f"#p{to[3]}"]
    assert [p["publish"]["data"]["id"] for p in pubs] == [3, 4]
    assert pubs[0]["publish"]["data"]["t"] == 12.5


def test_per_step_counts_lost_and_latency_from_ids_alone():
    ranges = [(1, 4), (5, 8)]
    # two client processes; id 3 and 8 never came
    got = [(array("q", [1, 2, 5]), array("f", [1.0, 3.0, 50.0])),
           (array("q", [4, 6, 7]), array("f", [2.0, 60.0, 70.0]))]
    first, second = pf.per_step(ranges, got)
    assert (first["delivered"], first["lost"], first["p50_ms"], first["p99_ms"]) == (3, 1, 2.0, 3.0)
    assert (second["delivered"], second["lost"], second["p50_ms"]) == (3, 1, 60.0)
    # two devices per user: each message is owed twice
    assert [s["lost"] for s in pf.per_step(ranges, got, copies=2)] == [5, 5]


def test_the_sustained_rate_is_the_last_step_passing_with_every_step_below_it():
    steps = [{"rate": 10, "lost": 0, "p99_ms": 20.0}, {"rate": 20, "lost": 0, "p99_ms": 80.0},
             {"rate": 30, "lost": 0, "p99_ms": 150.0}, {"rate": 40, "lost": 0, "p99_ms": 90.0}]
    assert pf.sustained(steps) == (20, 30)  # 40 passes only after a failure: not counted
    assert pf.sustained([{"rate": 10, "lost": 1, "p99_ms": 5.0}]) == (None, 10)
    assert pf.sustained([{"rate": 10, "lost": 0, "p99_ms": 5.0}]) == (10, None)
    assert pf.sustained([{"rate": 10, "lost": 0, "p99_ms": 5.0, "duplicated": 1}]) == (None, 10)
    # the feed offered 9 of 10 per second: the step measured the feed, not the server
    assert pf.sustained([{"rate": 10, "lost": 0, "p99_ms": 5.0, "offered_per_s": 9.0}]) == (None, 10)


def test_cpu_in_a_window_is_the_difference_of_the_samples_inside_it():
    samples = [(0.0, {"server": 1.0}), (1.0, {"server": 1.5}), (2.0, {"server": 2.5}), (3.0, {"server": 4.0})]
    assert pf.cpu_in(samples, 0.5, 2.5) == {"server": 1.0}
    assert pf.cpu_in(samples, 0.5, 1.5) == {}  # one sample inside: nothing to measure


def test_ratios_need_both_sides():
    assert pf.ratio(3.0, 2.0) == 1.5
    assert pf.ratio(None, 2.0) is None and pf.ratio(3.0, 0) is None


def test_the_schedule_hands_out_every_id_once_in_ticks_and_marks_each_step():
    import asyncio

    from loadtest.peers.feeder import schedule

    async def run():
        marks: list[dict] = []
        got = [tick async for tick in schedule([(1000.0, 0.03), (500.0, 0.02)], 0.0, marks)]
        return got, marks

    got, marks = asyncio.run(run())
    assert got == [(1, 10), (11, 10), (21, 10), (31, 5), (36, 5)]
    assert [(m["first"], m["last"]) for m in marks] == [(1, 30), (31, 40)]
    assert all(m["end"] >= m["start"] and m["offered_per_s"] > 0 for m in marks)


def test_a_busy_sender_takes_what_queued_meanwhile_as_one_group_and_sees_the_end():
    import asyncio

    from loadtest.peers.feeder import take_all

    async def run():
        q: asyncio.Queue = asyncio.Queue()
        for item in ([1], [2], None):
            q.put_nowait(item)
        return await take_all(q)

    assert asyncio.run(run()) == ([[1], [2]], True)


def test_a_step_is_client_bound_when_the_clients_cost_over_half_the_servers_cpu_per_frame():
    assert pf.client_bound({"server": 30.0, "clients": 15.1}) is True
    assert pf.client_bound({"server": 30.0, "clients": 15.0}) is False
    assert pf.client_bound({"server": 30.0}) is None and pf.client_bound({}) is None


def test_a_run_names_both_cpu_per_frame_at_its_sustained_rate_and_is_bound_if_that_step_or_the_knees_was():
    def step(rate, server, clients):
        cpu = {"server": server, "clients": clients}
        return {"rate": rate, "cpu_us_per_frame": cpu, "client_bound": pf.client_bound(cpu)}

    steps = [step(10, 10.0, 8.0), step(20, 30.0, 9.0), step(30, 20.0, 12.0), step(40, 10.0, 9.0)]
    assert steps[0]["client_bound"]  # below the sustained rate: not what limits it
    cost = pf.client_cost("go", steps, best=20, knee=None)  # the rest never measured as passing
    assert cost == {"client": "go", "client_cpu_us_per_frame": 9.0, "server_cpu_us_per_frame": 30.0,
                    "client_share_of_server": 0.3, "client_bound": False}
    # the knee's step was bound by the client: the rate it failed at may be the client's
    assert pf.client_cost("go", steps, best=20, knee=30)["client_bound"] is True
    assert pf.client_cost("python", steps, best=None, knee=10)["client_cpu_us_per_frame"] is None
    unmeasured = [{"rate": 10}]
    assert pf.client_cost("go", unmeasured, best=10, knee=None)["client_bound"] is None


def test_the_tables_show_the_clients_cpu_per_frame_beside_the_servers_once_a_run_names_its_client():
    from loadtest.peers.report import client_rows, steps_table

    step = {"rate": 10, "offered_per_s": 10.0, "frames": 10, "lost": 0, "p50_ms": 1.0, "p99_ms": 2.0,
            "cpu_us_per_msg": {"server": 30.0, "feed": 5.0}, "cpu_us_per_frame": {"server": 30.0, "clients": 20.0},
            "client_bound": True}
    old = steps_table({"duplicated": 0, "steps": [step]})
    assert "clients" not in old[0] and old[2].endswith("| 30.0 | 5.0 |")  # as published before
    new = steps_table({"duplicated": 0, "client": "go", "steps": [step]})
    assert new[0].endswith("server / clients µs per frame |") and new[2].endswith("| 30.0 / 20.0 (client-bound) |")
    assert client_rows({}) == []
    row = client_rows({"client": "go", "ours_client_cpu_us_per_frame": 4.0, "ours_server_cpu_us_per_frame": 30.0,
                       "peer_client_cpu_us_per_frame": 5.0, "peer_server_cpu_us_per_frame": 8.0,
                       "peer_client_bound": True})
    assert row == ["| load clients' CPU per frame at that rate (go), µs; server's | 4.0; 30.0 | 5.0; 8.0 "
                   "(client-bound) | |"]
