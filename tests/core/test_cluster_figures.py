"""The cluster bench's figures from raw records (loadtest/cluster/figures.py), without I/O."""

from __future__ import annotations

from loadtest.cluster import figures as fig
from loadtest.cluster.traffic import Attempt, ClientDevice, Sent


def _sent(sender: str, recipient: str, msg_id: int | None, at: float, status: int = 201,
          upstream: str = "10.0.0.11:8000") -> Sent:
    return Sent(sender, recipient, at, f"k{msg_id}", msg_id, [Attempt(at, status, 0.01, upstream)])


def test_every_device_of_both_users_must_get_each_message_once():
    devices = [ClientDevice("a", 0, None), ClientDevice("a", 1, None), ClientDevice("b", 0, None),
               ClientDevice("c", 0, None)]
    sent = [_sent("a", "b", 1, 0.0), _sent("c", "a", 2, 0.1), _sent("b", "c", None, 0.2, status=503)]
    # Keys, not ids: b's copy of a message from another partition has another id.
    received = [["k1", "k2"], ["k1"], ["k1", "k1"], ["k2"]]  # a's 2nd device misses k2; b got k1 twice
    repeats = [0, 0, 0, 3]  # c's inbox dropped three repeats
    d = fig.check_delivery(sent, devices, received, repeats)
    assert (d.expected, d.lost, d.duplicated, d.lost_devices) == (6, 1, 4, 1)
    perfect = fig.check_delivery(sent, devices, [["k1", "k2"], ["k1", "k2"], ["k1"], ["k2"]], [0, 0, 0, 0])
    assert (perfect.lost, perfect.duplicated) == (0, 0)


def test_delivery_split_by_the_path_a_frame_took():
    devices = [ClientDevice("a", 0, 0), ClientDevice("b", 0, 0), ClientDevice("c", 0, 1)]
    partition = {"a": 0, "b": 0, "c": 1}.__getitem__
    # [arrival time, latency s, device, sender]: a to b (same partition), then a to c (a copy in c's)
    arrivals = [[1.0, 0.010, 0, "a"], [1.0, 0.020, 1, "a"], [2.0, 0.012, 0, "a"], [2.1, 0.090, 2, "a"]]
    paths = fig.delivery_by_path(arrivals, devices, partition)
    assert paths["sender"] == {"frames": 2, "p50": 12.0, "p99": 12.0}
    assert paths["recipient_same_partition"] == {"frames": 1, "p50": 20.0, "p99": 20.0}
    assert paths["recipient_other_partition"] == {"frames": 1, "p50": 90.0, "p99": 90.0}
    unpartitioned = fig.delivery_by_path(arrivals, devices, lambda user: 0)
    assert unpartitioned["recipient_other_partition"] == {"frames": 0, "p50": None, "p99": None}


def test_a_stage_s_mean_over_a_run_is_what_its_histogram_gained():
    assert fig.mean_between((1.0, 100.0), (1.5, 150.0)) == 10.0  # 0.5 s over 50 entries
    assert fig.mean_between((1.0, 100.0), (1.0, 100.0)) is None


def test_accepted_rate_in_a_window_and_by_host():
    sent = [_sent("a", "b", i, 10.0 + i * 0.1, upstream=f"10.0.0.1{1 + i % 3}:8000") for i in range(30)]
    sent.append(_sent("a", "b", None, 11.0, status=503))
    assert fig.accepted_per_s(sent, 10.0, 13.0) == 10.0
    addresses = {"10.0.0.11": "chat-h1", "10.0.0.12": "chat-h2", "10.0.0.13": "chat-h3"}
    assert fig.accepted_per_s(sent, 10.0, 13.0, lambda s, a: fig.host_of(a.upstream, addresses) != "chat-h1") == 6.7
    refused = fig.answers(sent, 10.0, 13.0, lambda a: a.status == 503)
    assert [a.at for a in refused] == [11.0]


def test_percentile_and_cpu_per_message():
    assert fig.percentile([], 0.5) is None
    assert fig.percentile([0.001 * i for i in range(1, 101)], 0.5) == 51.0
    assert fig.cpu_us_per_msg({"api": 0.5, "mysql": 0.0}, 1000) == {"api": 500.0, "mysql": 0.0}
    assert fig.cpu_us_per_msg({"api": 0.5}, 0) == {"api": None}


def test_prometheus_counter_and_decoded_shares():
    page = ("# HELP chat_daemon_oplog_entries_total Oplog entries read\n"
            "# TYPE chat_daemon_oplog_entries_total counter\n"
            "chat_daemon_oplog_entries_total 1234.0\n"
            "chat_daemon_oplog_entries_created 1.7e9\n")
    assert fig.prometheus_value(page, "chat_daemon_oplog_entries_total") == 1234.0
    assert fig.prometheus_value(page, "chat_relay_entries_total") == 0.0
    shares = fig.decoded_shares({"chat-h1/daemon_0": 500, "chat-h1/daemon_1": 250, "chat-h2/daemon_0": 10},
                                {"chat-h1": 1000}, {"chat-h1/daemon_0": "chat-h1", "chat-h1/daemon_1": "chat-h1",
                                                    "chat-h2/daemon_0": "chat-h2"})
    assert shares == {"chat-h1/daemon_0": 0.5, "chat-h1/daemon_1": 0.25, "chat-h2/daemon_0": None}


def test_a_message_between_partitions_costs_a_copy():
    sent = [_sent("a", "b", 1, 0.0), _sent("a", "a2", 2, 0.1), _sent("b", "a", None, 0.2, status=503)]
    partition = {"a": 0, "a2": 0, "b": 1}.__getitem__
    assert fig.writes_per_message(sent, partition) == 1.5  # one of the two stored messages crosses
    assert fig.writes_per_message(sent[2:], partition) is None


def test_the_marginal_cost_leaves_out_what_a_stage_spends_idle():
    # 2 s of writer CPU over a 10 s run with 0.1 s/s idle: 1 s is the messages'; 1000 messages
    got = fig.marginal_cpu_us_per_msg({"writer": 2.0, "relay": 0.05}, 10.0, {"writer": 0.5, "relay": 0.5}, 5.0, 1000)
    assert got == {"writer": 1000.0, "relay": 0.0}  # never below zero
    assert fig.marginal_cpu_us_per_msg({"writer": 2.0}, 10.0, {}, 0.0, 1000) == {"writer": None}


def test_each_daemon_is_expected_to_decode_its_partitions_share():
    assert fig.expected_shares({"h1/daemon_0": (0, 2), "h1/daemon_1": (1, 3)}, 4) == {"h1/daemon_0": 0.5,
                                                                                      "h1/daemon_1": 0.5}
    assert fig.expected_shares({"h1/daemon_0": (0,)}, 1) == {"h1/daemon_0": 1.0}


def test_the_writers_stage_from_two_scrapes_and_the_post_answers():
    before = dict.fromkeys(fig.WRITER_SAMPLES, 0.0)
    after = {**before, "chat_writer_batch_messages_count": 40, "chat_writer_batch_messages_sum": 100,
             "chat_writer_batch_seconds_sum": 0.4, 'chat_writer_turn_seconds_count{phase="holding"}': 20,
             'chat_writer_turn_seconds_sum{phase="holding"}': 0.6, 'chat_writer_turn_seconds_sum{phase="waiting"}': 2.0,
             "chat_writer_mongo_lag_seconds_count": 100, "chat_writer_mongo_lag_seconds_sum": 3.0,
             "chat_writer_mongo_insert_seconds_count": 30, "chat_writer_mongo_insert_seconds_sum": 0.6,
             "chat_writer_copy_lag_seconds_count": 50, "chat_writer_copy_lag_seconds_sum": 2.5}
    assert fig.writer_stage(before, after, 10.0) == {
        "turns_per_s": 2.0, "rows_per_commit": 2.5, "commit_ms": 10.0, "lock_wait_ms": 100.0, "lock_hold_ms": 30.0,
        "mongo_lag_ms": 30.0, "mongo_inserts_per_s": 3.0, "mongo_insert_ms": 20.0, "copy_lag_ms": 50.0}
    nothing = fig.writer_stage(before, before, 10.0)
    assert nothing["lock_hold_ms"] is None and nothing["copy_lag_ms"] is None  # no turn, no copy: no mean
    page = 'chat_writer_turn_seconds_count{phase="holding"} 7.0\nchat_writer_turn_seconds_count{phase="waiting"} 7.0\n'
    assert fig.prometheus_value(page, 'chat_writer_turn_seconds_count{phase="holding"}') == 7.0
    # each stored message's storing attempt; a refused one has none
    sent = [_sent("a", "b", i, 0.0) for i in range(1, 100)] + [_sent("a", "b", None, 0.0, status=503)]
    assert fig.post_answer_ms(sent) == {"p50": 10.0, "p99": 10.0}


def _bench(rate: float, global_p50: float, p4_p50: float, lost: int = 0) -> dict:
    def run(mode: str, partitions: int, p50: float, lost: int) -> dict:
        return {"mode": mode, "partitions": partitions, "delivery_p50_ms": p50, "lost": lost, "duplicated": 0,
                "msgs_per_s": rate,
                "cpu_us_per_msg": {"writer": 1000.0 * partitions, "ferretdb": 7000.0, "redis": None}}
    return {"traffic": {"offered_per_s": rate},
            "runs": [run("global-lock", 1, global_p50, 0), run("partitioned", 4, p4_p50, lost)]}


def test_a_load_sweep_pairs_each_bench_s_two_modes_by_offered_rate():
    from loadtest.cluster.load_sweep import summarise
    # rounds alternate the rates: 25, 100, then 25, 100 again
    rows = summarise([_bench(25, 130, 104), _bench(100, 150, 240), _bench(25, 120, 120, lost=1),
                      _bench(100, 140, 210)])
    assert [(r["offered_per_s"], r["global_lock_p50_ms"], r["p4_p50_ms"], r["p4_over_global"]) for r in rows] == [
        (25, [130, 120], [104, 120], [0.8, 1.0]), (100, [150, 140], [240, 210], [1.6, 1.5])]
    assert [(r["global_lock_cpu_ms_per_msg"], r["p4_cpu_ms_per_msg"], r["lost"]) for r in rows] == [
        (8.0, 11.0, 1), (8.0, 11.0, 0)]
    assert [(r["global_lock_cores"], r["p4_cores"]) for r in rows] == [(0.2, 0.28), (0.8, 1.1)]


def _ab_bench(global_p50: float, p4_p50: float, lost: int = 0) -> dict:
    def run(mode: str, p50: float, post: float, commit: float, lost: int) -> dict:
        return {"mode": mode, "delivery_p50_ms": p50, "lost": lost, "duplicated": 0,
                "post_ms": {"p50": post, "p99": 3 * post},
                "writers": {"commit_ms": commit, "copy_lag_ms": 40.0 if mode == "partitioned" else None,
                            "mongo_insert_ms": 30.0},
                "delivery_ms_by_path": {"sender": {"p50": p50 - 10}, "recipient_other_partition": {"p50": p50 + 20}},
                "cpu_us_per_msg": {"writer": 3500.0, "mysql": 1900.0, "toxiproxy": 1800.0}}
    return {"runs": [run("global-lock", global_p50, 70.0, 5.0, 0), run("partitioned", p4_p50, 15.0, 8.0, lost)]}


def test_an_ab_run_is_summarised_by_its_side_and_round():
    from loadtest.cluster.ab import summary_row
    row = summary_row("after", 2, _ab_bench(120.0, 150.0, lost=1))
    assert (row["side"], row["round"], row["global_lock_p50_ms"], row["p4_p50_ms"], row["p4_over_global"]) == (
        "after", 2, 120.0, 150.0, 1.25)
    assert (row["global_post_p50_ms"], row["p4_post_p50_ms"], row["global_commit_ms"], row["p4_commit_ms"]) == (
        70.0, 15.0, 5.0, 8.0)
    assert (row["p4_copy_lag_ms"], row["p4_copy_minus_sender_ms"], row["lost"], row["duplicated"]) == (40.0, 30.0, 1, 0)
    no_copies = _ab_bench(120.0, 150.0)
    no_copies["runs"][1]["delivery_ms_by_path"]["recipient_other_partition"] = {"p50": None}
    assert summary_row("before", 1, no_copies)["p4_copy_minus_sender_ms"] is None
