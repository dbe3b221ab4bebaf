"""The relay routed by user (relay/routing.py) as deployed: real daemons
behind one relay process, on the real oplog. Each daemon gets the entries of
the users it holds (and the other ids); every message still reaches every
socket once, in order: users on both daemons, a user whose first socket
comes while messages to it are being sent, the relay killed under traffic,
and a user whose last socket closed is no longer forwarded to its daemon.
Last, a routed stream on the real MariaDB and FerretDB, fed relay frames by
the test: a first socket that registers with a hole below the relay's marker.
"""

from __future__ import annotations

import asyncio
import signal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from chat.messages import Message, now_ms, shown_digest
from chatctl.client import Inbox, listen
from db import mongo
from db.stream_ranges import StreamRanges
from harness.servers import free_port
from harness.system import running_system
from oplog.events import Batch, Subscribed
from relay.routing import PASSED
from tests.e2e.helpers import post
from tests.e2e.test_oplog_tail import _Recorder, _stream_for_bob, reach
from tests.e2e.test_stream_ranges import mysql_database, store_in_mysql
from tests.timing import PATIENCE, eventually


def relay_metrics(port: int) -> dict[str, dict[str, float]]:
    """The relay's per-daemon samples, by metric: {daemon: value}."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=PATIENCE).text
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "daemon" in sample.labels and not sample.name.endswith("_created"):
                out.setdefault(sample.name, {})[sample.labels["daemon"]] = sample.value
    return out


def log_count(system, name: str, event: str) -> int:
    return (system.logdir / f"{name}.log").read_text().count(f"event={event}")


async def test_two_daemons_routed_by_user_deliver_every_message_once_in_order_through_a_late_join_and_a_relay_kill(
        dbs, users):
    port = free_port()
    with running_system(dbs, daemons=2, apis=1, relay=True, CHAT_RATE_LIMIT_PER_SECOND=0,
                        CHAT_RELAY_ROUTE_BY_USER="true",
                        CHAT_GAP_CHECK_SECONDS=1, CHAT_RELAY_METRICS_PORT=str(port)) as system:
        receivers: list[str] = []
        inboxes: dict[str, Inbox] = {}
        tasks: list[asyncio.Task] = []

        def join(user: str, since: str | None = None) -> None:
            receivers.append(user)
            inboxes[user] = Inbox(since)
            tasks.append(asyncio.create_task(listen(system.ws_url, system.token(user), since, lambda f: None,
                                                    max_backoff=0.5, inbox=inboxes[user])))

        expected: dict[str, list[int]] = {}
        try:
            # Receivers until both daemons hold some (SO_REUSEPORT places each socket).
            while len(relay_metrics(port).get("chat_relay_users", {})) < 2 or min(
                    relay_metrics(port)["chat_relay_users"].values()) < 1:
                assert len(receivers) < 40, "every socket landed on one daemon"
                join(users(f"r{len(receivers)}"))
                await eventually(lambda: all(inbox.hellos for inbox in inboxes.values()), "every receiver connected")
                await eventually(lambda: sum(relay_metrics(port).get("chat_relay_users", {}).values())
                                 == len(receivers), "the relay holds every receiver")
            late = users("late")  # offline while the first messages to it are stored
            expected = {r: [] for r in [*receivers, late]}
            async with httpx.AsyncClient(timeout=PATIENCE) as http:

                async def send(messages: range, to: list[str]) -> None:
                    for i in messages:
                        r = await post(system, users("s"), to[i % len(to)], f"m{i}", f"id-{i}", client=http)
                        assert r.status_code == 201, r.text
                        expected[to[i % len(to)]].append(int(r.json()["id"]))

                first = list(receivers)
                await send(range(16), [*first, late])
                # The late user's first socket comes while messages to it are on their way: its
                # catch-up (since 0, from the store) and the live stream meet without a gap.
                sending = asyncio.create_task(send(range(16, 40), [late, *first]))
                join(late, "0")
                await sending
                await eventually(lambda: set(expected[late]) <= inboxes[late].seen, "the late user got all")

                connected = {d: log_count(system, d, "relay_connected") for d in ("daemon_0", "daemon_1")}
                ready = log_count(system, "relay", "relay_ready")
                stored = sum(len(ids) for ids in expected.values())
                killing = asyncio.create_task(send(range(40, 72), [*first, late]))
                # The kill lands among the sends: some stored before it, the rest while no relay runs.
                await eventually(lambda: sum(len(ids) for ids in expected.values()) >= stored + 4, "sending")
                system.stop("relay", signal.SIGKILL)
                await killing  # the gap check delivers what is stored while no relay runs
                system.start("relay")
                await eventually(lambda: log_count(system, "relay", "relay_ready") > ready
                                 and all(log_count(system, d, "relay_connected") > n for d, n in connected.items()),
                                 "the daemons connected to the restarted relay")
                # The new relay was told every user again, in the hellos.
                await eventually(lambda: sum(relay_metrics(port).get("chat_relay_users", {}).values())
                                 == len(receivers), "the new relay holds every receiver")
                await send(range(72, 100), [*first, late])
            await eventually(lambda: all(set(expected[r]) <= inboxes[r].seen for r in receivers),
                             "every message delivered")
            for r in receivers:
                assert inboxes[r].duplicates == 0, f"{r} got a message twice"
                assert inboxes[r].ids == sorted(expected[r]), f"{r}: lost or out of order"
            # Each daemon was forwarded its users' entries, not the whole stream.
            forwarded = relay_metrics(port)["chat_relay_forwarded_total"]
            passed = relay_metrics(port)["chat_relay_passed_over_total"]
            assert len(forwarded) == 2 and all(passed[d] > 0 for d in forwarded)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_daemon_whose_users_last_socket_closed_is_forwarded_none_of_its_entries(dbs, users):
    port = free_port()
    with running_system(dbs, daemons=1, apis=1, relay=True, CHAT_RATE_LIMIT_PER_SECOND=0,
                        CHAT_RELAY_ROUTE_BY_USER="true",
                        CHAT_RELAY_USER_LINGER_SECONDS=0, CHAT_RELAY_METRICS_PORT=str(port)) as system:
        user, sender = users("held"), users("sender")
        inbox = Inbox()
        task = asyncio.create_task(listen(system.ws_url, system.token(user), None, lambda f: None, inbox=inbox))

        def total(name: str) -> float:
            return sum(relay_metrics(port).get(name, {}).values())

        try:
            await eventually(lambda: inbox.hellos and total("chat_relay_users") == 1, "the user is held")
            async with httpx.AsyncClient(timeout=PATIENCE) as http:
                sent = [await post(system, sender, user, f"m{i}", client=http) for i in range(5)]
                await eventually(lambda: len(inbox.ids) == 5, "the five delivered")
                assert inbox.ids == [int(r.json()["id"]) for r in sent]
                forwarded = total("chat_relay_forwarded_total")
                assert forwarded >= 5
                task.cancel()  # its last socket closes
                await asyncio.gather(task, return_exceptions=True)
                await eventually(lambda: total("chat_relay_users") == 0, "the daemon let the user go")
                passed = total("chat_relay_passed_over_total")
                for i in range(5):
                    assert (await post(system, sender, user, f"n{i}", client=http)).status_code == 201
            # The daemon saw their ids, and not their entries.
            await eventually(lambda: total("chat_relay_passed_over_total") >= passed + 5, "the ids passed over")
            assert total("chat_relay_forwarded_total") == forwarded
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class _RoutedFrames:
    """A relay routed by user as a stream sees it (its tail and its client):
    the frames are the test's, each step once the test says."""

    namespace = "routed.messages"
    last_ts = None
    by_user = True

    def __init__(self, *steps: list[Batch | Subscribed]):
        self.steps = steps
        self.go = [asyncio.Event() for _ in steps]
        self.subs: list[str] = []

    async def newest_ts(self):
        return None

    def want(self, namespace: str, user: str) -> int:
        self.subs.append(user)
        return len(self.subs)

    def drop(self, namespace: str, user: str) -> None:
        pass

    async def batches(self):
        for go, step in zip(self.go, self.steps, strict=True):
            await go.wait()
            for event in step:  # back to back: the consumer takes them together
                yield event
        await asyncio.Event().wait()

    @classmethod
    def frame(cls, sent: list[dict], passed: list[dict]) -> Batch:
        """``sent`` whole, ``passed`` as (id, digest)."""
        return Batch([{"op": "i", "ns": cls.namespace, "o": d, "ts": None} for d in sent],
                     b"".join(PASSED.pack(d["_id"], shown_digest(d)) for d in passed), cls.namespace)


async def test_a_first_socket_registers_with_a_hole_below_the_marker_and_gets_its_passed_over_message_whole(dbs):
    # Rows 1..6 are committed; the fast store lacks 2 (its writer died between MySQL and
    # Mongo). Before u is asked for, the relay passes over 1, 3 and 4 (1 and 3 are u's): 3
    # and 4 wait above the hole 2. u's marker comes right behind them, so u registers while
    # the hole is still open: the ids passed over below the marker are read back from MySQL,
    # whole, and u gets 1, 3 and 6, once, in order.
    msgs = {i: Message(i, "s", "u" if i in (1, 3, 6) else "z", f"m{i}", now_ms()) for i in range(1, 7)}
    docs = {i: m.to_doc() for i, m in msgs.items()}
    frame, namespace = _RoutedFrames.frame, _RoutedFrames.namespace
    frames = _RoutedFrames([frame([], [docs[1], docs[3], docs[4]]), Subscribed(namespace, 1)],
                           [frame([docs[6]], [docs[5]])])
    with mysql_database(dbs) as engine:
        ranges = StreamRanges(engine)
        async with _stream_for_bob(dbs.ferretdb.url, frames, cache_max=100, gap_check_seconds=30, ranges=ranges,
                                   relay=frames) as (db, stream, _bob):
            store_in_mysql(engine, list(msgs.values()))
            await db[mongo.MESSAGES].insert_many([d for i, d in docs.items() if i != 2])
            u = _Recorder("u", 0)

            async def subscribe() -> int:
                # As Daemon.subscribe does: hold, join, the position and the register with no await between.
                assert await stream.hold("u", PATIENCE), "u's marker never came"
                stream.join("u")
                position = stream.position
                stream.consumer.hub.register(u.subscriber)
                return position

            subscribing = asyncio.create_task(subscribe())
            frames.go[0].set()
            position = await subscribing
            # Registered before any of 1..4 was released (1 waited for MySQL's check, 2 was a
            # hole): the consumer took the marker and went to read MySQL, and u's hold went on
            # before that read came back. So 1, passed over, comes back whole and live too.
            assert frames.subs == ["u"] and position == 0
            catch_up = await stream.catch_up("u", 0, position)
            u.subscriber.go_live(catch_up.frames)
            frames.go[1].set()
            await reach(stream, 6)
            assert u.got == [1, 3, 6]
        ranges.close()
