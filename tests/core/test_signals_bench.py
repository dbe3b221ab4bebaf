"""loadtest.signals' pure parts: the watch lists, how a client side sends typing and records
frames, how typing frames are matched to the sends they answer, and how phases become the
published rows. No server runs."""

from __future__ import annotations

import random

import orjson

from loadtest import signals
from loadtest.report.signals_table import signals_table
from loadtest.signals import BOTH, MESSAGES, PAIR_GAP, STORM_PHASE, TYPING_ALONE, SignalsJob, SignalsClients


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def is_closing(self) -> bool:
        return self.aborted

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True


class FakeClient:
    def __init__(self) -> None:
        self.transport = FakeTransport()


def side_of(clients: int, indices: list[int], typing_rate: float = 0.0, storm: int = 0,
            window: int = 2) -> SignalsClients:
    job = SignalsJob("u", indices, clients, 3, storm, typing_rate, window, "127.0.0.1", 1, "s", "127.0.0.2",
                     "/dev/null")
    side = SignalsClients(job, random.Random(1))
    for user in side.users:
        side.clients[user] = FakeClient()  # type: ignore[assignment]
    return side


def frames(side: SignalsClients, user: str) -> list[dict]:
    """The client frames written to ``user``'s socket, unmasked."""
    out = []
    for raw in side.clients[user].transport.written:  # type: ignore[attr-defined]
        length = raw[1] & 0x7F
        start = 2 + (2 if length == 126 else 0)
        key, payload = raw[start:start + 4], raw[start + 4:]
        out.append(orjson.loads(bytes(b ^ key[i % 4] for i, b in enumerate(payload))))
    return out


def test_a_watch_list_is_distinct_others_the_same_each_time():
    for index in (0, 5, 9):
        watched = signals.watch_list(index, 10, 4)
        assert len(set(watched)) == 4 and index not in watched and all(0 <= j < 10 for j in watched)
        assert watched == signals.watch_list(index, 10, 4)
    assert sorted(signals.watch_list(0, 3, 50)) == [1, 2]


def written(side: SignalsClients) -> list[int]:
    return [len(side.clients[u].transport.written) for u in side.users]  # type: ignore[attr-defined]


def test_watch_frames_go_out_a_window_at_a_time_and_one_answered_by_an_error_again():
    side = side_of(10, [0, 2, 4])
    side.send_watches(0.0)
    assert written(side) == [1, 1, 0] and side.watch_out == 2
    assert frames(side, "u2") == [{"type": "watch", "users": side.watches["u2"]}]
    assert side.watches["u4"] == [f"u{j}" for j in signals.watch_list(4, 10, 3)]
    side.on_frame("u0", {"type": "presence", "users": [{"user": "u1", "online": True, "last_seen": None}]}, 1.0)
    side.on_frame("u2", {"type": "error", "code": "signals_unavailable", "message": "m", "frame": "watch"}, 1.0)
    again = side.watch_later[0][0]
    side.send_watches(again - 0.01)  # u4's; u2's waits
    assert written(side) == [1, 1, 1] and side.watch_out == 1 and not side.to_watch
    side.send_watches(again)
    assert written(side) == [1, 2, 1] and side.watch_out == 2
    for _ in range(2):  # its third try fails too: given up
        side.on_frame("u2", {"type": "error", "code": "signals_unavailable", "message": "m", "frame": "watch"}, 1.0)
        side.send_watches(side.watch_later[0][0] if side.watch_later else 0.0)
    assert written(side) == [1, 3, 1] and side.watch_failed == 1 and side.snapshots == 1 and side.watch_out == 1


def test_typing_goes_at_the_rate_to_watched_peers_and_never_to_one_pair_within_the_gap():
    side = side_of(20, list(range(10)), typing_rate=200.0)
    side.phase = 4
    side.start_typing()
    side.send_typing(50.0)
    side.send_typing(50.02)  # 4 due
    assert len(side.typing_sent) == 4
    for phase, user, peer, _at in side.typing_sent:
        assert phase == 4 and peer in side.watches[user]
    side.send_typing(50.0 + PAIR_GAP - 0.01)  # 218 due, 30 pairs (10 users x 3 peers): each once, no more
    assert len(side.typing_sent) == len(side.last_start) == 30
    side.send_typing(50.0 + PAIR_GAP + 0.5)
    assert 30 < len(side.typing_sent) <= 60
    for user in side.users:
        for frame in frames(side, user):
            assert frame["type"] == "typing" and frame["state"] == "start" and frame["to"] in side.watches[user]


def test_frames_are_recorded_by_kind():
    side = side_of(10, [0])
    side.phase = 2
    side.on_frame("u0", {"type": "typing", "from": "u3", "to": "u0", "state": "start", "ttl": 5}, 7.5)
    side.on_frame("u0", {"type": "typing", "from": "u0", "to": "u3", "state": "start", "ttl": 5}, 7.5)
    side.on_frame("u0", {"type": "presence", "users": [{"user": "u1", "online": True, "last_seen": None},
                                                       {"user": "u2", "online": False, "last_seen": None}]}, 8.0)
    side.on_frame("u0", {"type": "presence", "user": "u1", "online": False, "last_seen": "x"}, 9.0)
    side.on_frame("u0", {"type": "message", "id": "4", "from": "u1", "to": "u0", "body": "7.000000 load"}, 7.25)
    assert side.typing_seen == [["u3", "u0", 7.5]] and side.own_typing == 1
    assert (side.snapshots, side.snapshot_users, side.snapshot_online) == (1, 2, 1)
    assert side.changes == [[2, "u1", False, 9.0]] and side.latencies == {2: [0.25]}


def test_the_storm_drops_only_its_users_at_once():
    side = side_of(10, [0, 3, 6], storm=5)
    side.phase = STORM_PHASE
    kept = side.clients["u6"]
    dropped = side.drop_storm(5)
    assert dropped == ["u0", "u3"] and {u: p for u, (_, p) in side.closed_at.items()} == {"u0": 100, "u3": 100}
    assert side.clients == {"u6": kept} and not kept.transport.aborted  # type: ignore[attr-defined]


def test_a_pairs_typing_frames_answer_its_sends_in_order():
    sent = [[1, "a", "b", 10.0], [1, "a", "b", 12.0], [2, "a", "c", 20.0], [2, "c", "a", 30.0]]
    seen = [["a", "b", 12.5], ["a", "b", 12.75], ["a", "c", 20.5], ["a", "c", 20.6], ["b", "a", 1.0],
            ["a", "b", 9.0]]
    latencies, counts = signals.typing_latencies(sent, seen)
    assert latencies == {1: [2.5, 0.75], 2: [0.5]}  # a's first start to b came 2.5 s late, before its second
    assert counts == {"matched": 3, "missing": 1, "unmatched": 3}


def test_rows_changed_are_new_rows_and_moved_last_seen():
    assert signals.changed_rows({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["b", "c"]


def phase_round(name: str, index: int, daemons: float, latency: float) -> dict:
    typing = name in (TYPING_ALONE, BOTH)
    messages = name in (MESSAGES, BOTH)
    return {"name": name, "index": index, "typing_sent": 1000 if typing else 0, "sent": 500 if messages else 0,
            "asked": 500 if messages else 0, "send_errors": 0, "refused": [], "window_seconds": 10.0,
            "send_seconds": 10.0,
            "latencies": [latency] * 10 if messages else [], "typing_latencies": [0.01] * 10 if typing else [],
            "cpu_seconds": {"daemons": daemons, "redis": 0.1, "writer": 0.2, "relay": 0.05, "apis": 0.3,
                            "clients": 1.0, "sender": 0.1},
            "host_cpu": {"steal_pct": 0.0, "busy_pct": 90.0}}


def test_rounds_pool_and_typing_is_weighed_against_messages_alone():
    rows = [phase_round(TYPING_ALONE, 0, 0.5, 0), phase_round(MESSAGES, 1, 1.0, 0.1),
            phase_round(BOTH, 2, 1.4, 0.15)]
    phases = {name: signals.combine([r for r in rows if r["name"] == name], idle_daemon_cores=0.01)
              for name in signals.PHASES}
    assert phases[TYPING_ALONE]["cpu_us_per_signal"]["daemons"] == 500.0
    assert phases[TYPING_ALONE]["daemons_net_us_per_signal"] == 400.0  # 0.01 cores idle over 10 s
    assert phases[MESSAGES]["cpu_us_per_signal"] == {} and phases[MESSAGES]["cpu_us_per_message"]["daemons"] == 2000
    q = signals.ratios(phases)
    assert q["message_p50"] == 1.5 and q["cpu_daemons"] == 1.4 and q["typing_p50"] == 1.0
    assert signals.marginal_us_per_signal(phases) == 400.0


def test_the_result_is_tabled_and_judged():
    rows = [phase_round(TYPING_ALONE, 0, 0.5, 0), phase_round(MESSAGES, 1, 1.0, 0.1),
            phase_round(BOTH, 2, 1.4, 0.15)]
    memory = {"clients": 10, "held": 10, "connect_seconds": 1.0, "client_procs": 2, "watch": 3, "snapshots": 10,
              "watch_seconds": 0.5, "pss_kb_per_conn": 2.5, "rss_kb_per_conn": 2.6,
              "pss_kb_per_conn_second_half": 2.4, "pss_kb_per_conn_watching": 4.0, "rss_kb_per_conn_watching": 4.1,
              "pss_kb_per_watch_list": 1.5, "pss_kb_per_conn_after_phases": 6.0, "daemon_pss_mb_idle": 100.0,
              "client_pss_kb_per_conn": 8.0}
    out = {"received": {"u1": [1]}, "duplicates": 0, "latencies": {}, "own_typing": 0, "snapshots": 10,
           "snapshot_users": 30, "snapshot_online": 30, "errors": [], "error_count": 2, "failures": 0,
           "error_codes": {"watch signals_unavailable": 2},
           "storm_failures": 0, "gaps": {"100": {"u3": 0.5, "u4": 3.5}}, "closed": 0, "close_codes": [],
           "typing_sent": [[0, "u1", "u2", 1.0]], "typing_seen": [["u1", "u2", 1.01]],
           "changes": [[STORM_PHASE, "u3", False, 2.0], [1, "u3", True, 1.0]]}
    def stormed() -> list[dict]:
        return [{"phase": STORM_PHASE, "clients": 2, "back": 2, "back_seconds": 1.0, "last_seen_changed": 1,
                 "changed_users": ["u4"], "offline_while_connected": 0, "published": 2, "published_offline": 1,
                 "published_online": 1, "redis_commands": {"all": 40, "evalsha": 3}}]

    result = signals.summarize(rows, [out], {"u1": [1]}, stormed(), memory, {
        "idle_daemon_cores": 0.0, "daemon_counters": {}, "online_published_at_connect": 10})
    assert result["failed"] is None  # the watches answered signals_unavailable went again
    storm = result["storms"][0]
    assert storm["gaps_over_grace"] == 1 and storm["presence_frames_to_watchers"] == 1
    assert storm["changed_back_after_grace"] == 1 and storm["changed_back_within_grace"] == 0
    assert "changed_users" not in storm and result["presence_frames_outside_storms"] == 1
    assert result["typing"]["matched"] == 1 and result["memory"]["within_limit"]
    result.update(machine={"date": "2026-01-02T03:04:05+00:00", "commit": "abc", "cores": 2, "ram_gib": 8,
                           "mongo": "FerretDB", "mysql": "10.11", "redis": "Redis 7.0.15"},
                  parameters={"clients": 10, "watch": 3, "typing_rate": 100.0, "rate": 50.0, "seconds_per_phase": 10.0,
                              "rounds": 1, "grace_seconds": 3.0}, not_measured="across hosts.")
    lines = signals_table(result)
    assert lines[0] == "## Typing and presence (`python -m loadtest.signals`)"
    assert "| typing | 1,000 | 10/10 | 0 | – | 500 | 100 |" in "\n".join(lines)
    assert "| 2 | 1 | 3500/3500/3500 | 1 | **1** (0/1) | **2** (1/1) | 1 | 0 | 40 (evalsha 3) |" in lines
    assert lines[-2] == "Not measured here: across hosts."
    out["typing_seen"] = []
    out["error_codes"] = {"typing signals_unavailable": 1}
    failed = signals.summarize(rows, [out], {"u1": [1]}, stormed(), memory, {
        "idle_daemon_cores": 0.0, "daemon_counters": {}, "online_published_at_connect": 10})["failed"] or ""
    assert "1 of 1 never arrived" in failed and "typing signals_unavailable" in failed
