"""Prometheus metrics of the pusher, served on its own metrics port."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

NOTIFICATIONS = Counter("chat_pusher_notifications_total", "Notifications by what became of them: sent (the "
                        "gateway took them), failed (an attempt to retry), given_up, rejected (a pushkey the "
                        "gateway refused, whose registration is removed)", ["outcome"])
DECIDED = Gauge("chat_pusher_position", "Every row of the partition up to this id is decided", ["partition"])
OUTBOX = Gauge("chat_pusher_outbox", "Notifications decided and not yet taken by the gateway", ["partition"])
HELD = Counter("chat_pusher_decisions_held_total", "Steps that decided nothing because the partition's outbox held "
               "CHAT_PUSH_OUTBOX_MAX notifications (the gateway takes none)", ["partition"])
LEASES = Gauge("chat_pusher_leases", "Partitions whose pusher lock this process holds")
OUTBOX_WAIT = Histogram("chat_pusher_outbox_wait_seconds", "From a notification's decision to the gateway taking "
                        "it (retries included)", buckets=(.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300))
