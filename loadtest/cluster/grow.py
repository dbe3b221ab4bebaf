"""The cluster bench's grow scenario: `chatctl partitions grow` from 4 to 8 partitions, online,
under one-to-one traffic through nginx, every device checked.

What it reports (docs/cluster.md): messages lost, duplicated and stranded (a stored message
missing from a user's partition of the new map: the history a moved user reloads); each moved
user's history against MySQL; the POSTs of users who did not move that were refused (none may
be); the longest a moving user's POST took around the cutover; and how long after the cutover
the last device that was handed over was back.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from sqlalchemy import create_engine, text

from chat.partitions import SlotMap, suffix
from chat.settings import Settings, StoresSettings
from chatctl.partitions import grow
from cluster.up import Cluster
from loadtest.cluster import figures as fig
from loadtest.cluster.traffic import ClientDevice, Sent


# Rows per step: each step takes a target's lock, and waits for its turn to end (a hand-over
# grace, longer with a slow fast store); the bench's store holds every earlier run's history.
GROW_PAGE = 2000


@dataclass
class GrowFault:
    """Runs the mover in a thread of its own; its report lines are kept with the time each came."""

    cluster: Cluster
    to: int
    lines: list[tuple[float, str]]
    thread: threading.Thread | None = None
    error: BaseException | None = None

    def start(self) -> None:
        settings = Settings(stores=StoresSettings(mysql_url=self.cluster.admin_mysql_url,
                                                  mongo_url=self.cluster.admin_mongo_url))

        def run() -> None:
            try:
                described = grow(settings, self.to, report=lambda line: self.lines.append((time.time(), line)),
                                 page=GROW_PAGE)
                self.lines.append((time.time(), described.splitlines()[0]))
            except BaseException as exc:  # reported with the figures, never lost in the thread
                self.error = exc

        self.thread = threading.Thread(target=run, name="mover", daemon=True)
        self.thread.start()

    def wait(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    @property
    def cut_over_at(self) -> float | None:
        return next((at for at, line in self.lines if line.startswith("cut over")), None)

    @property
    def pause_ms(self) -> float | None:
        """What the mover measured: how long the involved partitions' writes waited at the cutover."""
        for _, line in self.lines:
            if line.startswith("cut over") and " paused " in line:
                return float(line.split(" paused ", 1)[1].split(" ms", 1)[0])
        return None


def history_check(mysql_url: str, sent: list[Sent], after: SlotMap) -> tuple[int, int]:
    """(stored messages, of them the ones missing from the partition of the new map of their
    sender or of their recipient): each user's partition must hold every message of theirs."""
    stored = [s for s in sent if s.msg_id is not None]
    by_partition: dict[int, set[tuple[str, str]]] = {}
    engine = create_engine(mysql_url)
    try:
        with engine.connect() as conn:
            for k in range(after.partitions):
                rows = conn.execute(text(f"SELECT sender, recipient, client_msg_id FROM messages{suffix(k)} "
                                         "WHERE kind = 0 AND client_msg_id IS NOT NULL")).all()
                held = by_partition.setdefault(k, set())
                for sender, recipient, key in rows:
                    held.add((sender, key))
                    held.add((recipient, key))
    finally:
        engine.dispose()
    stranded = sum(1 for s in stored
                   if (s.sender, s.key) not in by_partition[after.partition_of(s.sender)]
                   or (s.recipient, s.key) not in by_partition[after.partition_of(s.recipient)])
    return len(stored), stranded


def grow_figures(run: dict, devices: list[ClientDevice], before: SlotMap, after: SlotMap, fault: GrowFault,
                 history: tuple[int, int]) -> dict:
    """The grow run's figures from its traffic (``run``: run_traffic's result with its private parts)."""
    sent: list[Sent] = run["_sent"]
    data = run["_client"]
    moved = {u for u in {d.user for d in devices} if before.partition_of(u) != after.partition_of(u)}
    cut = fault.cut_over_at
    refusals = [a for s in sent if s.sender not in moved for a in s.attempts if a.status == 0 or a.status >= 500]
    refused_unmoved = len(refusals)
    why: dict[str, int] = {}
    for a in refusals:
        why[a.error or str(a.status)] = why.get(a.error or str(a.status), 0) + 1
    began = fault.lines[0][0] if fault.lines else None
    phases = {"before_the_move": 0, "copying": 0, "cutover_and_2s_after": 0, "later": 0}
    for a in refusals:
        if began is None or a.at < began:
            phases["before_the_move"] += 1
        elif cut is None or a.at < cut - (fault.pause_ms or 0) / 1000 - 1:
            phases["copying"] += 1
        elif a.at < cut + 2:
            phases["cutover_and_2s_after"] += 1
        else:
            phases["later"] += 1
    moving_posts = [s for s in sent if s.sender in moved and s.msg_id is not None and cut is not None
                    and s.attempts and abs(s.attempts[0].at - cut) < 10]
    longest = max(((s.attempts[-1].at + s.attempts[-1].seconds - s.attempts[0].at) for s in moving_posts),
                  default=None)
    longest_answer = max((a.seconds for s in moving_posts for a in s.attempts), default=None)
    moving_why: dict[str, int] = {}
    for s in moving_posts:
        for a in s.attempts:
            if a.status == 0 or a.status >= 500:
                moving_why[a.error or str(a.status)] = moving_why.get(a.error or str(a.status), 0) + 1
    handed_over = [i for i, d in enumerate(devices) if d.user in moved]
    back = [data["back_at"][i] for i in handed_over]
    not_back = sum(1 for b in back if b is None or (cut is not None and b < cut))
    last_back = max((b - cut for b in back if b is not None and cut is not None and b >= cut), default=None)
    stored, stranded = history
    # A moved device is told recovered: false and reloads history: what it missed live is
    # there unless stranded; every other device must have had everything live.
    stayed = [i for i, d in enumerate(devices) if d.user not in moved]
    live = fig.check_delivery(sent, [devices[i] for i in stayed], [data["received"][i] for i in stayed],
                              [data["duplicates"][i] for i in stayed])
    # A moved device is told `recovered: false` and reloads its history (README): frames before that
    # are superseded by the history, which holds each message once, under the new partition's ids.
    # What repeats after it is a duplicate; a message seen both before and after it is one the
    # client finds in the history it reloaded (counted apart, as `moved_seen_again_after_reload`).
    since_reload = [data["received"][i][data["reloaded_at"][i]:] for i in handed_over]
    moved_dup = sum(data["duplicates"][i] for i in handed_over) + sum(len(a) - len(set(a)) for a in since_reload)
    seen_again = sum(len(set(data["received"][i][:data["reloaded_at"][i]]) & set(a))
                     for i, a in zip(handed_over, since_reload, strict=True))
    return {
        "partitions_before": before.partitions, "partitions_after": after.partitions,
        "moved_users": len(moved), "moved_devices": len(handed_over), "devices": len(devices),
        "stored": stored, "stranded": stranded,
        "unmoved_lost": live.lost, "unmoved_duplicated": live.duplicated, "moved_duplicated": moved_dup,
        "moved_seen_again_after_reload": seen_again,
        "lost": live.lost + stranded, "duplicated": live.duplicated + moved_dup,
        "unmoved_refused_posts": refused_unmoved, "unmoved_refusals_by_error": why,
        "unmoved_refusals_by_phase": phases,
        "moving_longest_post_ms": None if longest is None else round(longest * 1000, 1),
        "moving_longest_answer_ms": None if longest_answer is None else round(longest_answer * 1000, 1),
        "moving_refusals_by_error": moving_why,
        "cutover_pause_ms": fault.pause_ms,
        "last_device_back_s": None if last_back is None else round(last_back, 2),
        "devices_not_back": not_back, "relearned_partition": data.get("relearned", 0),
        "mover": [line for _, line in fault.lines],
        "mover_error": (repr(fault.error) if fault.error is not None
                        else "it did not cut over within the run" if cut is None else None),
    }
