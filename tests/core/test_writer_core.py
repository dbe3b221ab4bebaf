"""The writer's decisions (writer/core.py), driven by a fake clock, with no database."""

import pytest

from chat.settings import Settings
from writer.core import (
    GRACE_PER_INSERT,
    HANDOVER_GRACE_MAX_SECONDS,
    INSERT_GAP_BELOW,
    INSERT_GAP_SECONDS,
    REPAIR_PAGE_MIN,
    TRANSITIONS,
    UNSENT_BATCHES,
    Event,
    IllegalTransition,
    NextStep,
    OutboxPlan,
    Phase,
    Timing,
    WriterCore,
    timing_of,
    batch_room,
    insert_gap,
    unsent_max,
)

TIMING = Timing(turn_max_seconds=0.25, checkpoint_seconds=1.0, mongo_retry_seconds=2.0,
                handover_check_seconds=0.02, head_every_seconds=1.0, handover_grace_seconds=0.25)
GRACE = TIMING.handover_grace_seconds


def core_in(phase: Phase, now: float = 100.0) -> WriterCore:
    """A core in ``phase``, reached by the events a turn goes through."""
    core = WriterCore(TIMING)
    if phase is Phase.IDLE:
        return core
    if phase is Phase.REPAIRING:
        assert core.locked(mirrored=5, last_id=9, now=now) is OutboxPlan.REPAIR
    elif phase is Phase.LOCKED:
        core._on(Event.LOCKED)
    else:
        core.locked(mirrored=9, last_id=9, now=now)
        if phase is Phase.OUTBOX:
            core.mongo_failed(now)
        elif phase is Phase.ENDING:
            core.ending()
    assert core.phase is phase
    return core


# --- the outbox found at the start of a turn ---------------------------------------------------

def test_a_turn_with_nothing_past_mirrored_upto_mirrors_at_once():
    core = WriterCore(TIMING)
    assert core.locked(mirrored=9, last_id=9, now=100.0) is OutboxPlan.NONE
    assert core.phase is Phase.MIRRORING and core.mirroring


def test_an_outbox_is_repaired_before_anything_newer_and_then_the_turn_mirrors():
    core = WriterCore(TIMING)
    assert core.locked(mirrored=5, last_id=9, now=100.0) is OutboxPlan.REPAIR
    assert core.phase is Phase.REPAIRING and not core.mirroring
    core.repaired(in_step=True, now=100.4)
    assert core.phase is Phase.MIRRORING
    assert core.turn_started == core.checkpointed == 100.4  # the turn's clock starts after the repair


def test_a_failed_repair_leaves_the_outbox_and_later_turns_leave_it_for_the_retry_window():
    core = WriterCore(TIMING)
    core.locked(mirrored=5, last_id=9, now=100.0)
    core.mongo_failed(now=101.0)  # the repair's insert
    assert core.phase is Phase.REPAIRING
    core.repaired(in_step=False, now=101.0)
    assert core.phase is Phase.OUTBOX and not core.mirroring
    core.ending()
    core.released()
    # within MONGO_RETRY_SECONDS of the failure: commit to MySQL, leave Mongo alone
    assert core.locked(mirrored=5, last_id=12, now=102.9) is OutboxPlan.LATER
    assert core.phase is Phase.OUTBOX
    core.released()
    # once it has passed: repair again
    assert core.locked(mirrored=5, last_id=12, now=103.0) is OutboxPlan.REPAIR


# --- when a turn ends, checkpoints -------------------------------------------------------------

def test_a_process_waiting_for_the_lock_ends_the_turn_after_the_batch_in_hand():
    assert core_in(Phase.MIRRORING, now=100.0).committed(others_waiting=False, now=100.001) is NextStep.GO_ON
    core = core_in(Phase.MIRRORING, now=100.0)
    assert core.committed(others_waiting=True, now=100.001) is NextStep.END
    # seen once, it holds for the turn (a later commit need not ask again), and only for that turn
    assert core.committed(others_waiting=False, now=100.002) is NextStep.END
    core.ending()
    core.released()
    core.locked(mirrored=9, last_id=9, now=100.1)
    assert core.committed(others_waiting=False, now=100.101) is NextStep.GO_ON


def test_a_busy_turn_checkpoints_every_checkpoint_seconds_and_keeps_the_lock():
    core = core_in(Phase.MIRRORING, now=100.0)
    assert core.committed(False, now=101.0) is NextStep.GO_ON  # not more than a second yet
    assert core.committed(False, now=101.01) is NextStep.CHECKPOINT
    core.checkpoint_done(101.02)
    assert core.committed(False, now=102.0) is NextStep.GO_ON
    assert core.committed(False, now=102.03) is NextStep.CHECKPOINT
    assert core.committed(False, now=500.0) is not NextStep.END  # Mongo keeps up: no end however long


def test_after_a_failed_insert_the_turn_ends_once_it_is_turn_max_old():
    core = core_in(Phase.MIRRORING, now=100.0)
    core.mongo_failed(now=100.1)
    assert core.phase is Phase.OUTBOX
    assert core.committed(False, now=100.25) is NextStep.GO_ON  # 0.25 s: not past TURN_MAX yet
    assert core.committed(False, now=100.26) is NextStep.END


def test_a_turn_that_started_behind_ends_once_it_is_turn_max_old():
    core = WriterCore(TIMING)
    core.mongo_failed(now=99.0)  # an insert that outlived its turn still opens the retry window
    assert core.phase is Phase.IDLE
    assert core.locked(mirrored=5, last_id=9, now=100.0) is OutboxPlan.LATER
    assert core.committed(False, now=100.2) is NextStep.GO_ON
    assert core.committed(False, now=100.3) is NextStep.END


def test_the_hand_over_check_rides_a_commit_at_most_every_handover_check_seconds():
    core = core_in(Phase.MIRRORING)
    asked = [t for t in (100.0, 100.01, 100.019, 100.021, 100.03, 100.045, 100.05) if core.handover_check_due(t)]
    assert asked == [100.0, 100.021, 100.045]
    every_commit = WriterCore(Timing(handover_check_seconds=0.0))
    assert all(every_commit.handover_check_due(t) for t in (1.0, 1.0, 1.0))


def test_a_leader_asks_less_often_than_a_writer_that_shares_its_lock():
    # commits every 40 ms, as a partition's at four partitions on three hosts
    commits = [100.0 + 0.04 * i for i in range(10)]
    shared, leader = WriterCore(timing_of(leads=False)), WriterCore(timing_of(leads=True))
    assert sum(shared.handover_check_due(t) for t in commits) == 10
    assert [t for t in commits if leader.handover_check_due(t)] == [commits[0], commits[3], commits[6], commits[9]]


# --- Mongo waited on under the lock, and handed over -------------------------------------------

def test_a_queued_writer_gets_the_lock_after_the_grace_not_after_the_insert_in_flight():
    """The turn ends for a queued process (END), and its last insert hangs:
    the drain waits the grace, then leaves the insert in flight, and the lock
    goes over. The outbox (what that insert was to copy) is the next turn's."""
    core = core_in(Phase.MIRRORING, now=100.0)
    turn = core.turn
    assert core.committed(others_waiting=True, now=100.01) is NextStep.END
    core.ending()
    assert core.mongo_patience(waited=0.0) == GRACE  # a normal insert ends well within it
    assert core.mongo_patience(waited=0.1) == pytest.approx(GRACE - 0.1)
    assert core.mongo_patience(waited=GRACE) is None  # not the Mongo timeout: the queued writer's wait is the same
    core.mongo_left(now=100.26)
    assert core.phase is Phase.ENDING and core.left
    assert not core.may_insert(turn)  # the pump, if its insert comes back, starts no other
    assert core.mongo_patience(waited=0.0) is None  # and nothing more of this turn waits on Mongo
    core.released()
    assert core.phase is Phase.IDLE


def test_a_turn_lingering_on_a_slow_insert_asks_at_the_grace_and_hands_over_once_someone_queues():
    core = core_in(Phase.MIRRORING, now=100.0)
    # nobody known to be queued: no MySQL round trip before the grace, then one every handover_check_seconds
    assert core.mongo_patience(waited=0.0) == GRACE
    assert core.mongo_patience(waited=GRACE) == TIMING.handover_check_seconds
    core.others_asked(False)
    assert core.mongo_patience(waited=GRACE + 0.02) == TIMING.handover_check_seconds
    core.others_asked(True)
    assert core.mongo_patience(waited=GRACE + 0.04) is None
    core.mongo_left(now=100.3)
    assert core.phase is Phase.OUTBOX and not core.mirroring
    # a request that came meanwhile is committed (MySQL only), and then the turn ends
    assert core.committed(others_waiting=False, now=100.31) is NextStep.END


def test_with_nobody_queued_a_turn_waits_on_mongo_as_long_as_the_call_takes():
    core = core_in(Phase.MIRRORING, now=100.0)
    for waited in (GRACE, 1.0, 2.0, 60.0):
        core.others_asked(False)
        assert core.mongo_patience(waited) == TIMING.handover_check_seconds
    assert not core.left and core.phase is Phase.MIRRORING


def test_a_repair_left_in_flight_ends_behind_and_the_turn_ends_after_the_batch_in_hand():
    core = WriterCore(TIMING)
    assert core.locked(mirrored=5, last_id=9, now=100.0) is OutboxPlan.REPAIR
    core.others_asked(True)
    assert core.mongo_patience(waited=GRACE) is None
    core.mongo_left(now=100.25)
    assert core.phase is Phase.REPAIRING
    core.repaired(in_step=False, now=100.25)
    assert core.phase is Phase.OUTBOX and not core.mirroring  # nothing newer goes to Mongo in this turn
    assert core.committed(others_waiting=False, now=100.26) is NextStep.END


def test_after_a_hand_over_with_mongo_in_flight_this_writer_leaves_mongo_alone_for_the_retry_window():
    """Even with no outbox (another writer copied it): the writer whose Mongo
    did not answer commits to MySQL only, instead of waiting on it again."""
    core = core_in(Phase.MIRRORING, now=100.0)
    core.others_asked(True)
    core.mongo_left(now=100.3)
    core.ending()
    core.released()
    assert core.locked(mirrored=9, last_id=9, now=102.29) is OutboxPlan.LATER
    assert core.phase is Phase.OUTBOX and not core.may_insert(core.turn)
    assert core.mongo_patience(waited=0.0) == GRACE  # a new turn: not left, nobody known to be queued
    core.released()
    assert core.locked(mirrored=9, last_id=9, now=102.3) is OutboxPlan.NONE
    assert core.may_insert(core.turn)


def test_the_pump_of_a_turn_that_has_ended_starts_no_insert():
    core = core_in(Phase.MIRRORING)
    first = core.turn
    assert core.may_insert(first)
    core.ending()
    assert core.may_insert(first)  # the last insert, waited for at the end
    core.released()
    assert not core.may_insert(first)
    core.locked(mirrored=9, last_id=9, now=101.0)
    assert core.may_insert(core.turn) and not core.may_insert(first)


@pytest.mark.parametrize("phase", list(Phase))
def test_an_insert_that_outlived_its_turn_may_fail_in_any_later_phase(phase):
    """Left in flight at a hand-over (or cut off at its timeout), an insert
    ends in whatever phase a later turn is in: never an IllegalTransition."""
    core = core_in(phase, now=100.0)
    core.mongo_failed(now=100.5)
    assert core.phase is (Phase.OUTBOX if phase is Phase.MIRRORING else phase)
    assert not core.may_insert(core.turn)  # Mongo fails here: this turn sends nothing more
    assert core.mongo_retry_at == 102.5


def test_the_default_grace_is_far_below_a_queued_writer_s_lock_wait():
    # The lock wait is CHAT_DB_TIMEOUT_SECONDS; the third writer in line waits for two holders' grace.
    assert 2 * HANDOVER_GRACE_MAX_SECONDS < Settings.field("stores.db_timeout_seconds").default / 2


def test_the_grace_grows_with_slow_inserts_up_to_its_cap_and_falls_back_as_they_speed_up():
    """A store that answers every insert slowly is not hung: a turn waits its
    inserts out rather than leave them for the next holder to copy again."""
    core = core_in(Phase.MIRRORING, now=100.0)
    core.mongo_answered(0.03)
    assert core.grace() == GRACE  # fast inserts: the configured grace
    core.mongo_answered(0.12)
    assert core.grace() == pytest.approx(GRACE_PER_INSERT * 0.12)  # at once, after one slow insert
    assert core.mongo_patience(waited=GRACE) == pytest.approx(GRACE_PER_INSERT * 0.12 - GRACE)
    core.others_asked(True)
    assert core.mongo_patience(waited=GRACE_PER_INSERT * 0.12) is None  # past it, queued: left in flight
    core.mongo_answered(1.9)  # an insert near the Mongo timeout
    assert core.grace() == HANDOVER_GRACE_MAX_SECONDS
    for _ in range(200):  # then fast ones: back to the configured grace, not below it
        core.mongo_answered(0.01)
    assert core.grace() == GRACE


def test_a_writer_caps_the_grace_at_a_quarter_of_its_lock_wait():
    core = WriterCore(Timing(handover_grace_seconds=0.25).within_lock_wait(1.2))
    core.mongo_answered(5.0)
    assert core.grace() == 0.3
    assert Timing().within_lock_wait(10.0).handover_grace_max_seconds == HANDOVER_GRACE_MAX_SECONDS
    # a cap below the configured grace leaves the configured one
    core = WriterCore(Timing(handover_grace_seconds=0.25, handover_grace_max_seconds=0.1))
    core.mongo_answered(5.0)
    assert core.grace() == 0.25


# --- meta.head ---------------------------------------------------------------------------------

def test_meta_head_moves_at_most_every_second_while_busy_and_at_once_when_idle():
    core = WriterCore(TIMING)
    assert core.head_due(10, now=100.0)
    core.head_moved(10, now=100.0)
    assert not core.head_due(10, now=200.0, idle=True)  # nothing new
    assert not core.head_due(20, now=100.5)  # busy: not twice a second
    assert core.head_due(20, now=100.5, idle=True)
    assert core.head_due(20, now=101.01)


def test_meta_head_waits_while_mongo_is_failing():
    core = WriterCore(TIMING)
    core.head_failed(now=100.0)
    assert not core.head_due(10, now=101.9, idle=True)
    assert core.head_due(10, now=102.0, idle=True)
    assert core.phase is Phase.IDLE  # a hint that failed ends no turn


# --- the table of transitions ------------------------------------------------------------------

LEGAL = set(TRANSITIONS)


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("event", list(Event))
def test_every_event_the_table_does_not_list_is_refused(phase, event):
    core = core_in(phase)
    if (phase, event) in LEGAL:
        assert core._on(event) is TRANSITIONS[phase, event]
    else:
        with pytest.raises(IllegalTransition, match=f"{event.value} while {phase.value}"):
            core._on(event)
        assert core.phase is phase  # a refused event changes nothing


def test_a_release_ends_a_turn_from_any_phase():
    for phase in Phase:
        core = core_in(phase)
        core.released()
        assert core.phase is Phase.IDLE


def test_a_second_lock_without_a_release_is_refused():
    core = core_in(Phase.MIRRORING)
    with pytest.raises(IllegalTransition):
        core.locked(mirrored=9, last_id=9, now=101.0)


def test_commits_cannot_resume_once_the_turn_is_ending():
    core = core_in(Phase.ENDING)
    with pytest.raises(IllegalTransition):
        core.repaired(in_step=True, now=101.0)
    with pytest.raises(IllegalTransition):
        core.ending()


# --- batching and the pump ---------------------------------------------------------------------

@pytest.mark.parametrize(("taken", "queued", "batch_max", "room"), [
    (1, 0, 50, 0), (1, 10, 50, 10), (1, 100, 50, 49), (50, 10, 50, 0), (3, 5, 3, 0), (1, 5, 1, 0)])
def test_a_batch_takes_what_is_queued_up_to_batch_max(taken, queued, batch_max, room):
    assert batch_room(taken, queued, batch_max) == room


def test_commits_wait_for_mongo_only_past_unsent_batches_batches():
    assert unsent_max(50) == 50 * UNSENT_BATCHES
    assert unsent_max(2) == 2 * UNSENT_BATCHES


def test_the_pump_pauses_between_inserts_unless_a_flood_waits():
    assert insert_gap(0) == insert_gap(INSERT_GAP_BELOW - 1) == INSERT_GAP_SECONDS
    assert insert_gap(INSERT_GAP_BELOW) == insert_gap(10_000) == 0.0


def test_once_the_call_left_in_flight_lands_the_outbox_need_not_wait_out_the_window():
    """A slow insert, not a failed one: once it succeeds, turns mirror again at
    once, instead of each committing to MySQL only for the next to repair."""
    core = core_in(Phase.MIRRORING, now=100.0)
    core.others_asked(True)
    core.mongo_left(now=100.3)
    core.ending()
    core.released()
    assert core.locked(mirrored=9, last_id=9, now=100.5) is OutboxPlan.LATER
    core.released()
    core.left_call_landed()
    assert core.locked(mirrored=9, last_id=9, now=100.6) is OutboxPlan.NONE


def test_a_failure_s_window_stays_when_a_call_left_in_flight_lands():
    core = core_in(Phase.MIRRORING, now=100.0)
    core.mongo_failed(now=100.1)
    core.others_asked(True)
    core.mongo_left(now=100.3)
    core.ending()
    core.released()
    core.left_call_landed()
    assert core.locked(mirrored=9, last_id=9, now=101.0) is OutboxPlan.LATER


def test_a_repair_page_that_stalls_halves_the_next_down_to_the_floor_and_landing_pages_double_it_back():
    core = WriterCore(repair_page=2000)
    assert core.repair_page == 2000
    core.repair_page_stalled()
    assert core.repair_page == 1000
    for _ in range(10):
        core.repair_page_stalled()
    assert core.repair_page == REPAIR_PAGE_MIN
    core.repair_page_landed()
    assert core.repair_page == 2 * REPAIR_PAGE_MIN
    for _ in range(10):
        core.repair_page_landed()
    assert core.repair_page == 2000


def test_a_repair_page_smaller_than_the_floor_is_never_made_bigger_by_a_stall():
    core = WriterCore(repair_page=10)
    core.repair_page_stalled()
    assert core.repair_page == 10  # a page set below the floor is the floor
