"""The writer's decisions, pure: what a turn under the writer lock does next.

A *turn* is one hold of the MySQL named lock ``chat.writer``
(writer/turn.py does the I/O). Its phases, and the events that move
it from one to the next, are a table (``TRANSITIONS``); an event the table
does not list for the phase at hand is a bug of the shell, and raises
``IllegalTransition`` instead of being taken silently.

    IDLE --locked--> LOCKED --in_step--> MIRRORING --mongo_failed / mongo_left--> OUTBOX
                       |  \\--behind------------------------------------------------^
                       \\--repairing--> REPAIRING --in_step / behind------------------^
    LOCKED, REPAIRING, MIRRORING, OUTBOX --ending--> ENDING --released--> IDLE
    REPAIRING, OUTBOX, ENDING --mongo_left--> the same phase
    IDLE, LOCKED, REPAIRING, OUTBOX, ENDING --mongo_failed--> the same phase
    (any phase) --released--> IDLE   (a failure ends the turn wherever it is)

MIRRORING: the committed messages go on to Mongo, in id order, behind the
commits. OUTBOX: Mongo is behind (an insert failed, the turn left one in
flight, or the repair was left for later): commits go on, nothing more goes
to Mongo in this turn, and the committed rows past ``mirrored_upto`` are the
outbox that a later turn copies first.

A turn keeps another process waiting on its Mongo for a moment at most: once
one is queued for the lock (``queued``), a Mongo call the turn waits on is
waited for the grace at most (``grace``: ``handover_grace_seconds``, longer
while the store answers slowly, ``mongo_answered``; ``mongo_patience``); then the
turn leaves it in flight (``mongo_left``), ends after the batch in hand and
releases the lock. A call left in flight, or cut off at its timeout, may end in any later
phase: its failure is taken wherever it lands, and none of its successors
starts an insert (``may_insert``). Why ids still reach Mongo in id order:
docs/design.md, section 1.

Every time is an argument (``now``, a ``time.monotonic()`` reading), so the
tests drive it with a fake clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from chat.errors import ChatError

REPAIR_PAGE = 2000  # outbox rows copied to Mongo per MySQL read and insert, at most
# A page whose insert failed or was left in flight makes the next one half as big, down to
# this; each that lands, twice as big again. A fast store that cannot take a whole page
# within a turn's grace (FerretDB behind a grow's copies: 1,000 rows timed out again and again
# while every host's turn retried the same page) still takes a smaller one, and each page
# that lands is progress kept.
REPAIR_PAGE_MIN = 50
# A turn whose Mongo insert failed ends after this long, so that the next one
# repairs the outbox once Mongo is back (MONGO_RETRY_SECONDS) instead of
# committing to it for as long as requests keep coming.
TURN_MAX_SECONDS = 0.25
# A turn that runs on (requests keep coming, nobody else is queued for the
# lock) records mirrored_upto and moves meta.head this often, instead of
# ending to do so: each end stops every commit for a whole Mongo insert
# (docs/decisions/mongo-insert-pump.md).
CHECKPOINT_SECONDS = 1.0
# Committed messages that may wait for Mongo, in batches of batch_max: past
# that, commits wait for the insert in flight (Mongo slower than MySQL for
# long must slow the writer down, not grow a queue without end).
UNSENT_BATCHES = 4
# A pause after each Mongo insert before the next one starts: back-to-back
# inserts slow FerretDB's tails, and with them delivery. Commits never wait
# for it, it delays only the start of the next insert, and with
# INSERT_GAP_BELOW messages or more waiting for Mongo (a flood of POSTs)
# there is none. The figures: docs/decisions/mongo-insert-pump.md.
INSERT_GAP_SECONDS = 0.005
INSERT_GAP_BELOW = 64
# After a failed Mongo write, turns leave the outbox alone this long
# (messages are still stored and answered; the copy waits), so that a Mongo
# that is down or hung costs one timeout, not one per turn under the lock.
MONGO_RETRY_SECONDS = 2.0
# How long a turn waits on a Mongo call (an insert, the repair's, the last
# insert at its end) while another process is queued for the lock, before it
# hands the lock over and leaves the call in flight. Normal inserts take a few
# to a few tens of ms: they finish within it, and the next holder finds no
# outbox to repair. A hung one (a cut link, a stopped FerretDB) waited out the
# Mongo timeout (CHAT_DB_TIMEOUT_SECONDS) under the lock, and the queued
# writers, whose lock wait is the same timeout, answered 503.
HANDOVER_GRACE_SECONDS = 0.25
# But a store that answers every insert, slowly, is not one that hangs. FerretDB at the limit
# of its core took 100-300 ms an insert at P = 4 on three hosts: past a fixed 0.25 s the turn
# left it in flight, the next holder copied the same rows again (a duplicate costs FerretDB a
# read that scans the collection), which slowed every insert more, until inserts timed out. So
# the grace is GRACE_PER_INSERT times the recent inserts' time when that is longer, up to
# HANDOVER_GRACE_MAX_SECONDS: the third writer in line, behind two holders' grace, still gets
# the lock well within its own lock wait (CHAT_DB_TIMEOUT_SECONDS).
GRACE_PER_INSERT = 3.0
HANDOVER_GRACE_MAX_SECONDS = 0.45
# The recent inserts' time: up at once to a slower insert, down by this factor at each faster one.
INSERT_TIME_DECAY = 0.9
# How often a batch's commit asks whether another process is queued for the
# lock (one more round trip, and the host's one writer process is nearly
# always alone): a waiting process waits this much longer at most.
HANDOVER_CHECK_SECONDS = 0.02
# The same for the leader of its partition (CHAT_WRITER_LEADS), which is nearly always alone at
# its lock: the others take it while it is away, for an idle turn's drain every few seconds, or
# for a POST that reached their host. At four partitions on three hosts a partition commits
# every 40 ms or so, so asking every 20 ms was a round trip in nearly every commit, in the
# commit of every original and of every copy; every 100 ms it is one in three, and the rare
# process queued behind a leader waits up to 80 ms more.
LED_HANDOVER_CHECK_SECONDS = 0.1
# meta.head is only a hint for the daemons' gap check, and every write of it
# is one more oplog entry: at most this often while busy (at once when idle).
HEAD_EVERY_SECONDS = 1.0


class IllegalTransition(ChatError):
    """An event that the phase at hand does not allow: a bug of the writer's shell."""


class Phase(Enum):
    IDLE = "idle"  # no turn: this writer does not hold the lock
    LOCKED = "locked"  # the lock is held and the stream state read; the outbox not looked at yet
    REPAIRING = "repairing"  # copying the outbox to Mongo before anything newer
    MIRRORING = "mirroring"  # committing; Mongo follows in id order behind the commits
    OUTBOX = "outbox"  # committing; Mongo is behind, nothing more goes there in this turn
    ENDING = "ending"  # no more commits: the last insert, the checkpoint, the release


class Event(Enum):
    LOCKED = "locked"
    REPAIRING = "repairing"
    IN_STEP = "in_step"  # Mongo holds every committed id (or will, behind the commits)
    BEHIND = "behind"  # the outbox stays for a later turn
    MONGO_FAILED = "mongo_failed"
    MONGO_LEFT = "mongo_left"  # a Mongo call is left in flight: another process is queued for the lock
    ENDING = "ending"
    RELEASED = "released"


TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.IDLE, Event.LOCKED): Phase.LOCKED,
    (Phase.LOCKED, Event.IN_STEP): Phase.MIRRORING,
    (Phase.LOCKED, Event.BEHIND): Phase.OUTBOX,
    (Phase.LOCKED, Event.REPAIRING): Phase.REPAIRING,
    (Phase.REPAIRING, Event.IN_STEP): Phase.MIRRORING,
    (Phase.REPAIRING, Event.BEHIND): Phase.OUTBOX,
    # A failed insert: the turn's own, or one that outlived its turn (left in
    # flight at a hand-over, or cut off at its timeout), which ends in whatever
    # phase a later turn of this writer is in. Either way Mongo is failing here.
    (Phase.IDLE, Event.MONGO_FAILED): Phase.IDLE,
    (Phase.LOCKED, Event.MONGO_FAILED): Phase.LOCKED,  # the plan is then LATER
    (Phase.REPAIRING, Event.MONGO_FAILED): Phase.REPAIRING,  # the repair then ends BEHIND
    (Phase.MIRRORING, Event.MONGO_FAILED): Phase.OUTBOX,
    (Phase.OUTBOX, Event.MONGO_FAILED): Phase.OUTBOX,
    (Phase.ENDING, Event.MONGO_FAILED): Phase.ENDING,  # the last insert, waited for at the end
    # A Mongo call waited on past the grace while another process is queued: left in flight.
    (Phase.REPAIRING, Event.MONGO_LEFT): Phase.REPAIRING,  # the repair then ends BEHIND
    (Phase.MIRRORING, Event.MONGO_LEFT): Phase.OUTBOX,  # the batch in hand is committed, then the turn ends
    (Phase.OUTBOX, Event.MONGO_LEFT): Phase.OUTBOX,  # its pump's insert, after another call's failure
    (Phase.ENDING, Event.MONGO_LEFT): Phase.ENDING,  # the last insert
    **{(phase, Event.ENDING): Phase.ENDING
       for phase in (Phase.LOCKED, Phase.REPAIRING, Phase.MIRRORING, Phase.OUTBOX)},
    **{(phase, Event.RELEASED): Phase.IDLE for phase in Phase},
}


class OutboxPlan(Enum):
    """What a turn does with the outbox it finds when it takes the lock."""

    NONE = "none"  # Mongo holds everything committed
    REPAIR = "repair"  # copy it now, before anything newer
    # Mongo failed (or was left in flight) moments ago: commit without waiting on it
    # again under the lock, whether or not there is an outbox.
    LATER = "later"


class NextStep(Enum):
    """What a turn does after a batch is committed and handed to the mirror."""

    GO_ON = "go_on"  # take the next batch
    CHECKPOINT = "checkpoint"  # record mirrored_upto (and hint meta.head), then take the next batch
    END = "end"  # hand the lock over (another process waits) or let the outbox be repaired


@dataclass(frozen=True, slots=True)
class Timing:
    """The writer's intervals, in seconds (the module's constants by default)."""

    turn_max_seconds: float = TURN_MAX_SECONDS
    checkpoint_seconds: float = CHECKPOINT_SECONDS
    mongo_retry_seconds: float = MONGO_RETRY_SECONDS
    handover_check_seconds: float = HANDOVER_CHECK_SECONDS
    head_every_seconds: float = HEAD_EVERY_SECONDS
    handover_grace_seconds: float = HANDOVER_GRACE_SECONDS
    handover_grace_max_seconds: float = HANDOVER_GRACE_MAX_SECONDS

    def within_lock_wait(self, seconds: float) -> Timing:
        """This timing for a queued writer's lock wait of ``seconds``: the grace's cap lowered, if
        need be, so that two holders' longest grace stay within half of it."""
        return dataclasses.replace(self, handover_grace_max_seconds=min(self.handover_grace_max_seconds, seconds / 4))


DEFAULT_TIMING = Timing()
LED_TIMING = Timing(handover_check_seconds=LED_HANDOVER_CHECK_SECONDS)


def timing_of(leads: bool) -> Timing:
    """The intervals of a partition's writer, whether or not it leads that partition."""
    return LED_TIMING if leads else DEFAULT_TIMING


def batch_room(taken: int, queued: int, batch_max: int) -> int:
    """How many of the ``queued`` requests join a batch that has ``taken`` already."""
    return max(0, min(batch_max - taken, queued))


def unsent_max(batch_max: int) -> int:
    """Committed messages that may wait for Mongo before a commit waits for the insert in flight."""
    return batch_max * UNSENT_BATCHES


def insert_gap(unsent: int) -> float:
    """The pause before the next Mongo insert, with ``unsent`` messages waiting for it."""
    return INSERT_GAP_SECONDS if unsent < INSERT_GAP_BELOW else 0.0


class WriterCore:
    """The state the writer's decisions need, across turns and within one."""

    __slots__ = ("checkpointed", "handover_check_at", "head_at", "head_written", "insert_seconds", "left",
                 "mongo_retry_at", "phase", "queued", "repair_page", "repair_page_max", "retry_for_left", "sending",
                 "timing", "turn", "turn_started")

    def __init__(self, timing: Timing = DEFAULT_TIMING, repair_page: int | None = None):
        self.timing = timing
        self.repair_page_max = REPAIR_PAGE if repair_page is None else repair_page
        self.repair_page = self.repair_page_max  # outbox rows the next repair page reads and inserts
        self.phase = Phase.IDLE
        self.turn_started = 0.0  # when the turn began committing
        self.checkpointed = 0.0  # when mirrored_upto was last recorded in this turn
        self.handover_check_at = 0.0  # the next commit at or after it asks whether another process waits
        self.mongo_retry_at = 0.0  # until then, after a failed Mongo write, the outbox waits
        self.retry_for_left = False  # that wait was opened by a call left in flight, not by a failure
        self.head_written = 0  # the id meta.head was last moved to
        self.head_at = 0.0  # when
        self.turn = 0  # counts the turns: an insert belongs to the turn it was made for
        self.queued = False  # another process is known to be queued for the lock (in this turn)
        self.left = False  # this turn left a Mongo call in flight (and hands the lock over)
        self.sending = False  # the turn's committed messages may still go to Mongo
        self.insert_seconds = 0.0  # the recent answered inserts' time (``mongo_answered``)

    def _on(self, event: Event) -> Phase:
        try:
            self.phase = TRANSITIONS[self.phase, event]
        except KeyError:
            raise IllegalTransition(f"writer: {event.value} while {self.phase.value}") from None
        return self.phase

    # --- a turn -----------------------------------------------------------
    def locked(self, mirrored: int, last_id: int, now: float) -> OutboxPlan:
        """The lock is taken and the stream state read: what to do with the outbox.
        Within ``mongo_retry_seconds`` of a failed (or left) Mongo call the turn
        leaves Mongo alone, even with nothing to repair: another writer, whose
        Mongo answers, copies what it commits."""
        self._on(Event.LOCKED)
        self.turn += 1
        self.queued = self.left = False
        if now < self.mongo_retry_at:
            self._writing(Event.BEHIND, now)
            return OutboxPlan.LATER
        if mirrored >= last_id:
            self._writing(Event.IN_STEP, now)
            return OutboxPlan.NONE
        self._on(Event.REPAIRING)
        return OutboxPlan.REPAIR

    def repaired(self, in_step: bool, now: float) -> None:
        """The repair is over: Mongo holds the outbox (``in_step``), or it failed and the rest waits."""
        self._writing(Event.IN_STEP if in_step else Event.BEHIND, now)

    def repair_page_landed(self) -> None:
        """An outbox page went into Mongo: the next may be twice as big."""
        self.repair_page = min(self.repair_page_max, self.repair_page * 2)

    def repair_page_stalled(self) -> None:
        """An outbox page's insert failed or was left in flight: the next is half as big."""
        self.repair_page = max(min(REPAIR_PAGE_MIN, self.repair_page_max), self.repair_page // 2)

    def _writing(self, event: Event, now: float) -> None:
        self._on(event)
        self.sending = event is Event.IN_STEP
        self.turn_started = self.checkpointed = now

    @property
    def mirroring(self) -> bool:
        """Committed messages go on to Mongo in this turn."""
        return self.phase is Phase.MIRRORING

    def handover_check_due(self, now: float) -> bool:
        """Whether this commit asks if another process waits for the lock
        (then the next one asks ``handover_check_seconds`` later at the earliest)."""
        if now < self.handover_check_at:
            return False
        self.handover_check_at = now + self.timing.handover_check_seconds
        return True

    def committed(self, others_waiting: bool, now: float) -> NextStep:
        """A batch is committed and answered: end the turn, checkpoint, or go on."""
        self.queued = self.queued or others_waiting
        if self.queued:
            return NextStep.END  # after the batch in hand: lingering must not hold another host's requests
        if self.phase is Phase.OUTBOX and now - self.turn_started > self.timing.turn_max_seconds:
            return NextStep.END  # the next turn repairs the outbox once Mongo is back
        if now - self.checkpointed > self.timing.checkpoint_seconds:
            return NextStep.CHECKPOINT
        return NextStep.GO_ON

    def checkpoint_done(self, now: float) -> None:
        self.checkpointed = now

    def ending(self) -> None:
        """No more commits in this turn: the last insert, the checkpoint and the release follow."""
        self._on(Event.ENDING)

    def released(self) -> None:
        """The lock is given up (or lost with its connection), whatever the turn did."""
        self._on(Event.RELEASED)
        self.sending = False

    # --- waiting on Mongo under the lock --------------------------------------
    def others_asked(self, waiting: bool) -> None:
        """MySQL was asked whether another process is queued for the lock."""
        self.queued = self.queued or waiting

    def mongo_patience(self, waited: float) -> float | None:
        """How much longer the turn waits on a Mongo call it has waited on for
        ``waited`` seconds, before it asks again whether another process is
        queued; None: not at all, it leaves the call in flight (``mongo_left``).
        Nobody queued: as long as the call takes (each call has its own timeout)."""
        if self.left:
            return None  # one call left in flight: the turn waits on Mongo no more
        grace = self.grace()
        if waited < grace:
            return grace - waited
        return None if self.queued else self.timing.handover_check_seconds

    def grace(self) -> float:
        """How long a Mongo call is waited for while another process is queued: the
        configured grace, or ``GRACE_PER_INSERT`` times the recent inserts' time, up to the cap."""
        t = self.timing
        return max(t.handover_grace_seconds, min(t.handover_grace_max_seconds, GRACE_PER_INSERT * self.insert_seconds))

    def mongo_answered(self, seconds: float) -> None:
        """An insert (or a repair's) was answered after ``seconds``: the recent
        inserts' time follows a slower one at once, and a faster one slowly."""
        self.insert_seconds = max(seconds, self.insert_seconds * INSERT_TIME_DECAY)

    def mongo_left(self, now: float) -> None:
        """The turn leaves a Mongo call in flight and hands the lock over: it
        commits the batch in hand (MySQL only) and ends; what the call was to
        copy is the outbox. This writer's Mongo did not answer in time: its turns
        leave Mongo alone for ``mongo_retry_seconds``, as after a failure."""
        self._on(Event.MONGO_LEFT)
        self.left, self.sending = True, False
        if now >= self.mongo_retry_at:
            self.retry_for_left = True
        self.mongo_retry_at = max(self.mongo_retry_at, now + self.timing.mongo_retry_seconds)

    def left_call_landed(self) -> None:
        """A call left in flight has succeeded: this writer's Mongo answers, if
        slowly. Turns need not leave the outbox for the rest of the wait that
        leaving the call opened: each turn in it would commit to MySQL only, and
        the next turn copy that outbox, one repair per turn. A failure's wait stays."""
        if self.retry_for_left:
            self.mongo_retry_at, self.retry_for_left = 0.0, False

    def may_insert(self, turn: int) -> bool:
        """Whether turn ``turn``'s pump may start its next insert: not once the turn
        has ended (its successor copies the rest first), left a call in flight, or
        seen an insert fail."""
        return turn == self.turn and self.sending

    # --- Mongo ------------------------------------------------------------
    def mongo_failed(self, now: float) -> None:
        """An insert into Mongo failed (this turn's, or one that outlived its turn):
        this turn sends nothing more, and the outbox waits a while."""
        self._on(Event.MONGO_FAILED)
        self.sending, self.retry_for_left = False, False
        self.mongo_retry_at = max(self.mongo_retry_at, now + self.timing.mongo_retry_seconds)

    def head_failed(self, now: float) -> None:
        """A write of meta.head failed: only a hint, but a sign that Mongo is failing."""
        self.mongo_retry_at, self.retry_for_left = now + self.timing.mongo_retry_seconds, False

    def head_due(self, upto: int, now: float, idle: bool = False) -> bool:
        """Whether to move meta.head to ``upto``: it is behind, and the last
        move is ``head_every_seconds`` old (any age when idle), and Mongo has not failed moments ago."""
        return (upto > self.head_written and (idle or now - self.head_at > self.timing.head_every_seconds)
                and now >= self.mongo_retry_at)

    def head_moved(self, upto: int, now: float) -> None:
        self.head_written, self.head_at = upto, now
