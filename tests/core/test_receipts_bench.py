"""loadtest.receipts' pure parts: how a client side answers frames, how events are
matched to the client frames they answer, and how phases become the published row.
No server runs."""

from __future__ import annotations

from loadtest import receipts
from loadtest.clients.lean_processes import LeanJob, kb_per_connection
from loadtest.receipts import ACKING, BASELINE, QUIET, READING, ReceiptsClients
from loadtest.report.receipts_table import receipts_table


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.written.append(data)


class FakeClient:
    def __init__(self) -> None:
        self.transport = FakeTransport()


def side_of(*users: str) -> ReceiptsClients:
    side = ReceiptsClients(LeanJob(list(users), "127.0.0.1", 1, "s", "127.0.0.2", "/dev/null"))
    for user in users:
        side.clients[user] = FakeClient()  # type: ignore[assignment]
    return side


def message(msg_id: str, sender: str, to: str, sent_at: float = 100.0) -> dict:
    return {"type": "message", "id": msg_id, "from": sender, "to": to, "body": f"{sent_at:.6f} load"}


def payloads(side: ReceiptsClients, user: str) -> list[bytes]:
    return [frame[6:] for frame in side.clients[user].transport.written]  # type: ignore[attr-defined]


def test_an_acking_client_acks_every_message_frame_its_own_echo_included():
    side = side_of("b")
    side.mode, side.phase = ACKING, 1
    side.on_frame("b", message("7", "a", "b"), 100.25)
    side.on_frame("b", message("8", "b", "a"), 100.5)
    assert payloads(side, "b") == [b'{"type":"ack","upto":"7"}', b'{"type":"ack","upto":"8"}']
    assert [s[:4] for s in side.sent] == [[1, "ack", "b", "7"], [1, "ack", "b", "8"]]
    assert side.latencies == {1: [0.25, 0.5]} and side.newest == {"b": 8}


def test_a_reading_client_marks_only_what_was_sent_to_it_and_a_quiet_one_sends_nothing():
    side = side_of("b")
    side.mode, side.phase = READING, 2
    side.on_frame("b", message("7", "a", "b"), 101.0)
    side.on_frame("b", message("8", "b", "a"), 101.0)
    assert payloads(side, "b") == [b'{"type":"read","peer":"a","upto":"7"}']
    side.mode = QUIET
    side.on_frame("b", message("9", "a", "b"), 101.0)
    assert len(payloads(side, "b")) == 1 and side.counted_messages == 3


def test_events_are_timed_on_the_peers_socket_and_counted_on_the_actors():
    side = side_of("a", "b")
    side.on_frame("a", {"type": "delivered", "id": "9", "from": "b", "to": "a", "upto": "7"}, 5.0)
    side.on_frame("b", {"type": "delivered", "id": "9", "from": "b", "to": "a", "upto": "7"}, 5.0)
    side.on_frame("b", {"type": "error", "code": "past_newest", "message": "m", "frame": "ack"}, 5.0)
    assert side.seen == [["delivered", "b", "a", "7", 5.0]]
    assert side.own_events == 1 and side.errors == [{"code": "past_newest", "message": "m", "frame": "ack"}]


def test_catch_up_acks_each_newest_message_once_over_ticks_and_its_events_are_not_timed():
    side = side_of("a", "b", "c")
    for user in ("a", "b", "c"):
        side.on_frame(user, message("7", "x", user), 1.0)
    side.start_catch_up()
    side.catch_up(ticks=2)
    assert [len(payloads(side, u)) for u in ("a", "b", "c")] == [1, 1, 0]
    side.catch_up(ticks=2)
    side.catch_up(ticks=2)
    assert [payloads(side, u) for u in ("a", "b", "c")] == [[b'{"type":"ack","upto":"7"}']] * 3
    side.on_frame("x", {"type": "delivered", "id": "9", "from": "b", "to": "x", "upto": "7"}, 5.0)
    assert side.sent == [] and side.seen == [] and side.catch_up_events == 1


def test_an_event_answers_the_first_client_frame_of_its_actor_and_upto():
    sent = [[1, "ack", "b", "7", 10.0], [1, "ack", "b", "7", 9.5], [2, "read", "b", "7", 20.0]]
    seen = [["delivered", "b", "a", "7", 10.5], ["read", "b", "a", "7", 20.25], ["delivered", "c", "a", "7", 1.0],
            ["read", "b", "a", "8", 1.0]]
    latencies, unmatched = receipts.event_latencies(sent, seen)
    assert latencies == {1: {"delivered": [1.0]}, 2: {"read": [0.25]}}
    assert unmatched == 2


def phase_round(name: str, latency: float, daemons: float, rows: dict) -> dict:
    return {"name": name, "sent": 100, "latencies": [latency] * 10,
            "event_latencies": {"delivered": [0.2]} if name == "acks" else {},
            "cpu_seconds": {"daemons": daemons, "writer": 0.01, "relay": 0.0, "apis": 0.02, "clients": 1.0,
                            "sender": 0.1},
            "rows": rows, "frames_sent": {"ack": 200} if name == "acks" else {}, "frames": 210,
            "host_cpu": {"steal_pct": 0.0, "busy_pct": 90.0}}


def test_rounds_of_a_phase_pool_and_ratios_are_to_the_baseline():
    phases = {"baseline": receipts.combine([phase_round("baseline", 0.1, 0.01, {"message": 100})] * 2),
              "acks": receipts.combine([phase_round("acks", 0.15, 0.02, {"message": 100, "delivered": 90})] * 2)}
    acks = phases["acks"]
    assert acks["messages"] == 200 and acks["rows"] == {"message": 200, "delivered": 180}
    assert acks["rows_per_message"] == {"message": 1.0, "delivered": 0.9}
    assert acks["cpu_us_per_message"]["daemons"] == 200.0 and acks["event_ms"]["delivered"]["p50"] == 200.0
    assert acks["frames_sent"] == {"ack": 400, "read": 0}
    ratios = receipts.ratios(phases)
    assert ratios["acks"]["message_p50"] == 1.5 and ratios["acks"]["cpu_daemons"] == 2.0
    assert "cpu_clients" not in ratios["acks"] and BASELINE not in ratios


def test_memory_per_connection_and_what_fails_a_run():
    assert kb_per_connection(1_000_000, 1_000_000 + 2048 * 1000, 1000) == 2.0
    result = {"lost": 0, "duplicates": 0, "memory": {"held": 10, "clients": 10}, "sent": 5, "asked": 5,
              "refused": [], "error_frame_count": 0, "closed": 0, "close_codes": []}
    assert receipts.failure(result) is None
    assert receipts.failure({**result, "closed": 2, "close_codes": [1008]}) == "2 connections closed (codes [1008])"


def test_the_section_names_its_commit_its_machine_and_ferretdb():
    phases = {"baseline": receipts.combine([phase_round("baseline", 0.1, 0.01, {"message": 100})]),
              "acks": receipts.combine([phase_round("acks", 0.15, 0.02, {"message": 100, "delivered": 90})])}
    result = {"machine": {"date": "2026-01-02T03:04:05+00:00", "commit": "abc1234", "cores": 2, "ram_gib": 23.5,
                          "mongo": "FerretDB 1.24 (SQLite backend), not MongoDB", "mysql": "10.11"},
              "parameters": {"clients": 10000, "rate": 1000.0, "seconds_per_phase": 15.0, "rounds": 2},
              "deployed": {"apis": 2, "daemons": 2}, "phases": phases, "ratios": receipts.ratios(phases),
              "memory": {"held": 10000, "pss_kb_per_conn": 2.5, "rss_kb_per_conn": 2.6, "limit_kb": 3.0,
                         "pss_kb_per_conn_second_half": 2.4,
                         "within_limit": True, "pss_kb_per_conn_after_phases": 9.0},
              "client_cost": {"what": "lean", "cpu_us_per_frame": 20.0, "sender_cpu_us_per_message": 500.0},
              "sent": 200, "asked": 200, "lost": 0, "duplicates": 0, "error_frame_count": 0, "closed": 0,
              "unmatched_events": 0, "catch_up_events": 5, "failed": None}
    text = "\n".join(receipts_table(result))
    assert "commit abc1234" in text and "2026-01-02" in text and "FerretDB 1.24" in text
    assert ("| acks | 100 | 150/150 | delivered | 200/200 | 200 | delivered 0.9, message 1 | 200 | 100 | 0 | 200 |"
            in text)
    assert "| acks | 1.50× | 1.50× | 2.00× | 1.00× | – | 1.00× |" in text
    assert "2.5 KB PSS" in text and "within the 3 KB limit" in text
