"""The outbox's size and age, and when it is loud (writer/outbox_watch.py), with a fake clock."""

from datetime import UTC, datetime, timedelta

from writer.outbox_watch import LOUD_AFTER_SECONDS, OutboxWatch

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_an_empty_or_unknown_outbox_has_no_age_and_is_quiet():
    watch = OutboxWatch()
    assert watch.age(T0) == 0.0 and not watch.due_loud(T0, 100.0)
    watch.seen(5)  # size known, oldest not read yet
    assert watch.age(T0 + timedelta(hours=1)) == 0.0


def test_past_its_limit_it_is_loud_once_per_period_until_cleared():
    watch = OutboxWatch()
    watch.seen(50, T0)
    just_under = T0 + timedelta(seconds=LOUD_AFTER_SECONDS - 0.1)
    assert watch.age(just_under) < LOUD_AFTER_SECONDS and not watch.due_loud(just_under, 0.0)
    later = T0 + timedelta(seconds=LOUD_AFTER_SECONDS)
    assert watch.due_loud(later, 100.0)  # the first loud line
    assert not watch.due_loud(later + timedelta(seconds=5), 105.0)  # not again within the period
    assert watch.due_loud(later + timedelta(seconds=10), 110.0)  # and again after it
    watch.seen(20)  # a page copied: the size moves, the oldest is kept until read again
    assert watch.size == 20 and watch.oldest == T0
    watch.cleared()
    assert (watch.size, watch.oldest) == (0, None) and not watch.due_loud(later + timedelta(minutes=5), 500.0)
