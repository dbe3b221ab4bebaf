"""The cluster bench's figures from its raw records, without I/O: lost and
duplicated per device, accepted POSTs/s in a window, answer times, the
daemons' decoded shares, CPU per message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loadtest.cluster.traffic import Attempt, ClientDevice, Sent


@dataclass
class Delivery:
    expected: int  # (message, device) pairs that must arrive
    lost: int
    duplicated: int
    lost_devices: int  # devices that missed at least one message


def check_delivery(sent: list[Sent], devices: list[ClientDevice], received: list[list[str]],
                   repeats: list[int]) -> Delivery:
    """Each stored message must reach every device of its sender and of its
    recipient exactly once. ``received[i]``: the keys (client_msg_id) of the
    messages device i took, in order (its Inbox already dropped repeated ids,
    counted in ``repeats[i]``)."""
    want: dict[str, set[str]] = {}
    for s in sent:
        if s.msg_id is not None:
            want.setdefault(s.sender, set()).add(s.key)
            want.setdefault(s.recipient, set()).add(s.key)
    expected = lost = dup = lost_devices = 0
    for device, ids, again in zip(devices, received, repeats, strict=True):
        wanted = want.get(device.user, set())
        got = set(ids)
        missing = len(wanted - got)
        expected += len(wanted)
        lost += missing
        lost_devices += missing > 0
        dup += again + len(ids) - len(got)
    return Delivery(expected, lost, dup, lost_devices)


def writes_per_message(sent: list[Sent], partition_of: Callable[[str], int]) -> float | None:
    """Rows written per stored message: the original, and a copy in the recipient's partition
    when it is not the sender's. None when nothing was stored."""
    stored = [s for s in sent if s.msg_id is not None]
    if not stored:
        return None
    copies = sum(partition_of(s.sender) != partition_of(s.recipient) for s in stored)
    return round(1 + copies / len(stored), 3)


def accepted_attempt(s: Sent) -> Attempt | None:
    return s.attempts[-1] if s.msg_id is not None and s.attempts else None


def accepted_per_s(sent: list[Sent], start: float, end: float,
                   keep: Callable[[Sent, Attempt], bool] = lambda s, a: True) -> float:
    """Messages stored whose accepted answer came in [start, end), per second."""
    if end <= start:
        raise ValueError("empty window")
    n = 0
    for s in sent:
        a = accepted_attempt(s)
        if a is not None and start <= a.at + a.seconds < end and keep(s, a):
            n += 1
    return round(n / (end - start), 1)


def percentile(values: list[float], q: float, scale: float = 1000.0) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))] * scale, 2)


def delivery_by_path(arrivals: list[list], devices: list[ClientDevice],
                     partition_of: Callable[[str], int]) -> dict[str, dict[str, float | int | None]]:
    """Delivery p50/p99 ms by the path a frame took: to its sender's own devices
    (the original, from the sender's partition), to its recipient's in the same
    partition (the original), or to its recipient's in another partition (the
    copy, which its partition's writer makes after the original's commit)."""
    paths: dict[str, list[float]] = {"sender": [], "recipient_same_partition": [], "recipient_other_partition": []}
    for _, latency, device, sender in arrivals:
        user = devices[device].user
        if user == sender:
            paths["sender"].append(latency)
        elif partition_of(user) == partition_of(sender):
            paths["recipient_same_partition"].append(latency)
        else:
            paths["recipient_other_partition"].append(latency)
    return {path: {"frames": len(lat), "p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99)}
            for path, lat in paths.items()}


def mean_between(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """A histogram's mean over a run, in ms, from its (sum of seconds, count) before and after; None if nothing came."""
    count = after[1] - before[1]
    return round((after[0] - before[0]) / count * 1000, 2) if count > 0 else None


def answers(sent: list[Sent], start: float, end: float, keep: Callable[[Attempt], bool]) -> list[Attempt]:
    """Attempts sent in [start, end) that ``keep`` picks (a host's 503s, say)."""
    return [a for s in sent for a in s.attempts if start <= a.at < end and keep(a)]


def host_of(upstream: str, addresses: dict[str, str]) -> str:
    """The namespace of an API from nginx's upstream address (``10.213.0.11:8000``); "" if unknown."""
    return addresses.get(upstream.rsplit(":", 1)[0], "")


def decoded_shares(daemon_entries: dict[str, float], relay_entries: dict[str, float],
                   host_of_daemon: dict[str, str]) -> dict[str, float | None]:
    """Each daemon's oplog entries decoded over the run, as a share of the entries its host's relay
    passed on (1.0: it decoded the whole stream). None where the relay passed nothing."""
    out: dict[str, float | None] = {}
    for name, n in daemon_entries.items():
        total = relay_entries.get(host_of_daemon[name], 0.0)
        out[name] = round(n / total, 3) if total > 0 else None
    return out


def cpu_us_per_msg(cpu_seconds: dict[str, float], messages: int) -> dict[str, float | None]:
    return {role: (round(s * 1e6 / messages, 1) if messages else None) for role, s in cpu_seconds.items()}


def marginal_cpu_us_per_msg(busy: dict[str, float], busy_seconds: float, idle: dict[str, float],
                            idle_seconds: float, messages: int) -> dict[str, float | None]:
    """CPU per message past what each role spends idle: the busy window's CPU less the idle
    window's rate over as long. A stage's fixed per-second work (polls, checkpoints, each
    partition's turn) is paid per partition whatever the traffic; this is what a message adds."""
    if not messages or idle_seconds <= 0:
        return dict.fromkeys(busy)
    return {role: round(max(0.0, s - idle.get(role, 0.0) / idle_seconds * busy_seconds) * 1e6 / messages, 1)
            for role, s in busy.items()}


def expected_shares(served: dict[str, tuple[int, ...]], partitions: int) -> dict[str, float]:
    """The share of the stream each daemon should decode: the partitions it serves over all of them."""
    return {name: round(len(parts) / partitions, 3) for name, parts in served.items()}


# The writers' samples a run's stage figures come from (writer/metrics.py): group commits, lock turns
# and the Mongo insert's wait, as counts and sums of seconds.
WRITER_SAMPLES = (
    "chat_writer_batch_messages_count", "chat_writer_batch_messages_sum", "chat_writer_batch_seconds_sum",
    'chat_writer_turn_seconds_count{phase="holding"}', 'chat_writer_turn_seconds_sum{phase="holding"}',
    'chat_writer_turn_seconds_sum{phase="waiting"}',
    "chat_writer_mongo_lag_seconds_count", "chat_writer_mongo_lag_seconds_sum",
    "chat_writer_mongo_insert_seconds_count", "chat_writer_mongo_insert_seconds_sum",
    "chat_writer_copy_lag_seconds_count", "chat_writer_copy_lag_seconds_sum")


def writer_stage(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float | None]:
    """What every host's writers did between two scrapes of ``WRITER_SAMPLES``: lock turns a second
    (all partitions), rows per group commit, and the means of a commit, of a turn's wait for its
    partition's lock and of its hold of it, of a message's wait for its Mongo insert, and of a copy's
    commit behind its original's stamp (None with one partition: no copies), in ms."""
    d = {k: after[k] - before[k] for k in WRITER_SAMPLES}

    def mean_ms(total: str, count: str) -> float | None:
        return round(d[total] / d[count] * 1000, 2) if d[count] > 0 else None

    turns = 'chat_writer_turn_seconds_count{phase="holding"}'
    return {"turns_per_s": round(d[turns] / seconds, 1) if seconds > 0 else None,
            "rows_per_commit": round(d["chat_writer_batch_messages_sum"] / d["chat_writer_batch_messages_count"], 2)
            if d["chat_writer_batch_messages_count"] > 0 else None,
            "commit_ms": mean_ms("chat_writer_batch_seconds_sum", "chat_writer_batch_messages_count"),
            "lock_wait_ms": mean_ms('chat_writer_turn_seconds_sum{phase="waiting"}', turns),
            "lock_hold_ms": mean_ms('chat_writer_turn_seconds_sum{phase="holding"}', turns),
            "mongo_lag_ms": mean_ms("chat_writer_mongo_lag_seconds_sum", "chat_writer_mongo_lag_seconds_count"),
            "mongo_inserts_per_s": round(d["chat_writer_mongo_insert_seconds_count"] / seconds, 1)
            if seconds > 0 else None,
            "mongo_insert_ms": mean_ms("chat_writer_mongo_insert_seconds_sum",
                                       "chat_writer_mongo_insert_seconds_count"),
            "copy_lag_ms": mean_ms("chat_writer_copy_lag_seconds_sum", "chat_writer_copy_lag_seconds_count")}


def post_answer_ms(sent: list[Sent]) -> dict[str, float | None]:
    """p50/p99 of the answer time of each stored message's storing attempt (its 201 or 200): the API,
    the writer's queue and turn, and the MySQL commit."""
    times = [a.seconds for s in sent if (a := accepted_attempt(s)) is not None]
    return {"p50": percentile(times, 0.5), "p99": percentile(times, 0.99)}


def prometheus_value(text: str, name: str) -> float:
    """The sum of a counter's samples (every label set) in a /metrics page; 0 if absent."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            if head == name or head.startswith(name + "{"):
                total += float(value)
    return total
