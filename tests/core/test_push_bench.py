"""loadtest.push's pure parts: the expected set computed from what MySQL holds, the
match of the gateway's notifications against it, the phases' split and the
published section. No server runs."""

from __future__ import annotations

from loadtest import push
from loadtest.clients.lean_processes import LeanJob
from loadtest.push import Acker, Push, StreamRow, expected_pushes, in_windows, match, parse_received
from loadtest.report.push_table import HEADING, push_table, push_tables

DELIVERED = 4


def one_partition(_user: str) -> int:
    return 0


def row(msg_id: int, sender: str, to: str, created: float = 100.0, **kw) -> StreamRow:
    return StreamRow(0, msg_id, sender, to, created, **kw)


def note(arrival: float, event_id: int, user: str, device: str = "phone", partition: int = 0) -> Push:
    return Push(arrival, f"{partition}:{event_id}:{user}:{device}", partition, event_id, user, device)


def test_the_expected_set_is_what_no_device_acked_nor_the_user_read_of_messages_to_registered_users():
    rows = [row(1, "a", "bob"), row(2, "a", "bob"), row(3, "c", "bob"), row(4, "a", "bob", kind=DELIVERED),
            row(5, "a", "bob", deleted=True), row(6, "bob", "a"), row(7, "a", "ann"), row(8, "a", "bob", 108.0),
            row(9, "a", "carl"), row(10, "bob", "bob")]
    expected = expected_pushes(rows, one_partition, {0: (0, 9)}, acked={"bob": 1}, read={("bob", "c"): 3},
                               registered={"bob": ["phone"], "ann": ["phone", "tablet"], "a": []})
    # 1 acked, 3 read (its sender's marker), 4 an event, 5 deleted, 6 to a user with no device,
    # 9 to an unregistered user, 10 past the decided range (and to oneself)
    assert expected == {"bob": {2: 100.0, 8: 108.0}, "ann": {7: 100.0}}


def test_a_row_outside_the_recipient_s_own_partition_or_before_the_pusher_s_start_is_not_expected():
    rows = [StreamRow(0, 5, "a", "bob", 1.0), StreamRow(1, 5, "a", "bob", 1.0), StreamRow(1, 2, "a", "bob", 1.0)]
    expected = expected_pushes(rows, lambda user: 1, {0: (0, 9), 1: (3, 9)}, {}, {}, {"bob": ["phone"]})
    assert expected == {"bob": {5: 1.0}}


def test_parse_received_names_each_push_by_its_key():
    [p] = parse_received([{"arrival": 12.5, "key": "2:41:user:one:phone",
                            "notification": {"event_id": "41", "devices": [{"pushkey": "pk"}]}}])
    assert (p.arrival, p.partition, p.event_id, p.user, p.device) == (12.5, 2, 41, "user:one", "phone")


def test_a_notification_covers_every_message_of_its_window_up_to_its_event_id():
    expected = {"bob": {2: 100.0, 5: 101.0, 8: 110.0}}
    m = match(expected, {"bob": ["phone"]}, [note(104.0, 5, "bob"), note(114.0, 8, "bob")])
    assert (m.notifications, m.duplicates, m.unexpected, m.missing, m.covered) == (2, 0, [], [], 3)
    assert sorted(m.message_delays) == [(100.0, 4.0), (101.0, 3.0), (110.0, 4.0)]
    assert sorted(m.newest_delays) == [(101.0, 3.0), (110.0, 4.0)]
    assert sorted(m.per_notification) == [1, 2]


def test_a_message_past_every_notification_is_missing_on_each_device_that_lacks_it():
    expected = {"ann": {3: 1.0, 9: 2.0}}
    m = match(expected, {"ann": ["phone", "tablet"]}, [note(5.0, 3, "ann", "phone"), note(6.0, 9, "ann", "phone"),
                                                       note(5.0, 3, "ann", "tablet")])
    assert m.missing == [("ann", "tablet", 9)] and m.covered == 3


def test_a_key_taken_twice_is_a_duplicate_timed_by_its_first_arrival_and_a_push_of_nothing_missed_unexpected():
    expected = {"bob": {4: 10.0}}
    pushes = [note(14.0, 4, "bob"), note(13.5, 4, "bob"), note(15.0, 6, "bob"), note(15.0, 4, "carl"),
              note(15.0, 4, "bob", device="watch")]
    m = match(expected, {"bob": ["phone"]}, pushes)
    assert m.duplicates == 1 and m.notifications == 4
    assert m.unexpected == ["0:6:bob:phone", "0:4:carl:phone", "0:4:bob:watch"]
    assert m.message_delays == [(10.0, 3.5)] and m.missing == []


def test_values_go_to_the_phase_their_time_falls_in():
    pairs = [(5.0, 1.0), (10.0, 2.0), (19.9, 3.0), (20.0, 4.0), (99.0, 5.0)]
    assert in_windows(pairs, [10.0, 20.0]) == [[2.0, 3.0], [4.0, 5.0]]


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


def test_an_online_client_acks_every_message_frame_and_times_it_by_its_send_stamp():
    side = Acker(LeanJob(["b"], "127.0.0.1", 1, "s", "127.0.0.2", "/dev/null"))
    side.clients["b"] = FakeClient()  # type: ignore[assignment]
    side.on_frame("b", {"type": "message", "id": "7", "from": "a", "to": "b", "body": "100.000000 load"}, 100.25)
    side.on_frame("b", {"type": "delivered", "id": "8", "from": "a", "to": "b", "upto": "7"}, 100.5)
    side.on_frame("b", {"type": "error", "code": "writer_unavailable", "message": "m", "frame": "ack"}, 100.5)
    assert [f[6:] for f in side.clients["b"].transport.written] == [  # type: ignore[attr-defined]
        b'{"type":"ack","upto":"7"}']
    assert side.latencies == [[100.0, 0.25]] and side.acks == 1 and side.error_count == 1


def result_of(missing: int = 0) -> dict:
    phase = {"online_delivery_ms": {"p50": 50.0, "p99": 200.0}, "push_delay_ms": {"p50": 3100.0, "p99": 3500.0},
             "push_delay_newest_ms": {"p50": 3100.0, "p99": 3400.0}, "sent": 1000, "asked": 1000,
             "gateway_taken": 480, "gateway_refused": 0, "gateway_mode": "ok", "refused": [], "send_errors": 0,
             "pusher_cpu_seconds": 2.5}
    phases = [dict(phase, name=n, started=float(i)) for i, n in enumerate(push.PHASES)]
    phases[1]["gateway_mode"], phases[1]["gateway_refused"] = "fail", 900
    result = {
        "machine": {"date": "2026-01-02T03:04:05+00:00", "commit": "abc1234", "cores": 2, "ram_gib": 8,
                    "mongo": "FerretDB", "mysql": "10.11"},
        "parameters": {"users": 1000, "online": 500, "offline": 500, "rate": 100.0, "seconds_per_phase": 10.0,
                       "push_delay_seconds": 3.0, "outage": "fail"},
        "deployed": {"apis": 2, "daemons": 2},
        "phases": {p["name"]: {k: v for k, v in p.items() if k != "name"} for p in phases},
        "push": {"expected_messages": 1450, "expected_users": 480, "notifications": 1440, "covered": 1450,
                 "missing": missing, "duplicates": 0, "unexpected": 0,
                 "messages_per_notification": {"mean": 1.007, "max": 2},
                 "delay_all_ms": {"p50": 3200.0, "p99": 9000.0}, "gateway_refused": 900, "drain_seconds": 12.0,
                 "undecided_messages": 0, "outbox_left": 0},
        "pusher_cpu": {"us_per_notification": 900.0, "us_per_notification_net": 700.0, "idle_cores": 0.02,
                       "normal_us_per_notification": 650.0, "us_per_message": 400.0, "window": "the run",
                       "window_seconds": 45.0},
        "outage_effect": {"online_p50": 1.02, "online_p99": 0.97},
        "online": {"held": 500, "clients": 500, "lost": 0, "duplicates": 0, "acks_sent": 1500,
                   "error_frame_count": 0, "closed": 0, "close_codes": []},
        "registered": 500, "offline": 500, "sent": 3000, "asked": 3000, "refused": []}
    result["failed"] = push.failure(result)
    return result


def test_a_run_fails_on_a_missing_push_and_passes_without_one():
    assert push.failure(result_of()) is None
    assert push.failure(result_of(missing=2)) == "push: 2 missing, 0 duplicated, 0 unexpected"


def test_the_section_has_a_row_per_phase_and_says_its_commit_and_the_delay():
    lines = push_table(result_of())
    assert lines[0] == HEADING and "abc1234" in lines[2] and "2026-01-02" in lines[2]
    assert "`CHAT_PUSH_DELAY_SECONDS` = 3 s" in lines[4]
    rows = [line for line in lines if line.startswith(("| normal", "| outage", "| recovery"))]
    assert rows[1] == "| outage | 500 | 1,000 | 50/200 | 3100/3500 | 3100/3400 | 480 | 900 | 2500 |"
    assert any("0 missing, 0 duplicated, 0 unexpected" in line for line in lines)
    assert not any("FAILED" in line for line in lines)
    assert "**FAILED: push: 2 missing" in "\n".join(push_table(result_of(missing=2)))


def test_without_a_published_run_the_section_says_how_to_make_one(tmp_path):
    lines = push_tables(tmp_path)
    assert lines[0] == HEADING and "--publish" in lines[2]
