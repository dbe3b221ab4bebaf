"""The writer's decisions (writer/core.py), driven by a fake clock, with no database."""

import pytest

from writer.core import (
    INSERT_GAP_BELOW,
    INSERT_GAP_SECONDS,
    TRANSITIONS,
    UNSENT_BATCHES,
    Event,
    IllegalTransition,
    NextStep,
    OutboxPlan,
    Phase,
    Timing,
    WriterCore,
    batch_room,
    insert_gap,
    unsent_max,
)

TIMING = Timing(session_max_seconds=0.25, checkpoint_seconds=1.0, mongo_retry_seconds=2.0,
                handover_check_seconds=0.02, head_every_seconds=1.0)


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
    core = core_in(Phase.MIRRORING, now=100.0)
    assert core.committed(others_waiting=True, now=100.001) is NextStep.END
    assert core.committed(others_waiting=False, now=100.001) is NextStep.GO_ON


def test_a_busy_turn_checkpoints_every_checkpoint_seconds_and_keeps_the_lock():
    core = core_in(Phase.MIRRORING, now=100.0)
    assert core.committed(False, now=101.0) is NextStep.GO_ON  # not more than a second yet
    assert core.committed(False, now=101.01) is NextStep.CHECKPOINT
    core.checkpoint_done(101.02)
    assert core.committed(False, now=102.0) is NextStep.GO_ON
    assert core.committed(False, now=102.03) is NextStep.CHECKPOINT
    assert core.committed(False, now=500.0) is not NextStep.END  # Mongo keeps up: no end however long


def test_after_a_failed_insert_the_turn_ends_once_it_is_session_max_old():
    core = core_in(Phase.MIRRORING, now=100.0)
    core.mongo_failed(now=100.1)
    assert core.phase is Phase.OUTBOX
    assert core.committed(False, now=100.25) is NextStep.GO_ON  # 0.25 s: not past SESSION_MAX yet
    assert core.committed(False, now=100.26) is NextStep.END


def test_a_turn_that_started_behind_ends_once_it_is_session_max_old():
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
