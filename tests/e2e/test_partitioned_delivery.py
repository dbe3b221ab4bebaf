"""Delivery with two partitions, end to end: POST /v1/messages to the API, the
writer process, MariaDB and FerretDB, the relay, and daemon processes.

`db.init` lays out two partitions (``partitions=2``, as ``CHAT_PARTITIONS=2``).
Daemons serve one partition each (``CHAT_DAEMON_PARTITIONS``, each on its own
port) or both: a client at a daemon that does not serve its partition gets
421 and the partition; a message between two partitions reaches every device
of both users exactly once; each daemon decodes only its partitions' oplog
entries, through the relay; a partition with no messages holds up nobody.
"""

import asyncio
import contextlib
import functools
import uuid

import httpx
import orjson
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from chat.partitions import SlotMap
from chat.settings import Settings
from tests import front_door
from tests.e2e.helpers import connect, partition_rows, post, receive
from tests.e2e.test_chatctl import chatctl
from harness.system import System, databases, running_system
from tests.timing import PATIENCE, S, eventually

TWO = SlotMap.even(2)


def user_in(partition: int, name: str, slot_map: SlotMap = TWO) -> str:
    """A fresh user id whose slot is in ``partition``."""
    while slot_map.partition_of(user := f"{name}-{uuid.uuid4().hex[:8]}") != partition:
        pass
    return user


def rows_of(system: System, partition: int, sender: str) -> list:
    """``sender``'s rows in ``partition``'s MySQL table, by id."""
    return partition_rows(system.dbs, partition, "sender = :s", s=sender)


@contextlib.contextmanager
def writing_system(dbs, **env):
    """The write path as deployed: one API process writing through one writer process,
    and the relay the daemons tail through; no daemon (each test starts its own)."""
    with running_system(dbs, daemons=0, apis=1, writer=True, relay=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                        **env) as system:
        yield system


@contextlib.contextmanager
def daemon_serving(dbs, served: str, **env):
    """One daemon process on a port of its own, serving ``served`` ("" = all)."""
    with running_system(dbs, daemons=1, apis=0, CHAT_DAEMON_PARTITIONS=served, **env) as system:
        yield system


@pytest.fixture(scope="module")
def two_partitions(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("partitions"), partitions=2) as dbs:
        yield dbs


@pytest.fixture(scope="module")
def split(two_partitions):
    """The API, the writer and the relay; two daemons behind the relay, one per
    partition; and one daemon serving both, tailing on its own."""
    dbs = two_partitions
    with writing_system(dbs) as front:
        socket = front.env["CHAT_OPLOG_RELAY_SOCKET"]
        with daemon_serving(dbs, "0", CHAT_OPLOG_RELAY_SOCKET=socket) as d0, \
                daemon_serving(dbs, "1", CHAT_OPLOG_RELAY_SOCKET=socket) as d1, daemon_serving(dbs, "") as both:
            yield front, d0, d1, both


async def refusal_of_ws(system: System, user: str, query: str = "") -> tuple[int, dict]:
    with pytest.raises(InvalidStatus) as info:
        await websockets.connect(f"{system.ws_url}/v1/ws?token={system.token(user)}{query}")
    return info.value.response.status_code, orjson.loads(info.value.response.body)


async def poll(system: System, user: str, query: str = "") -> httpx.Response:
    async with httpx.AsyncClient(timeout=10 * S) as client:
        return await client.get(f"{system.poll_url}?timeout=0&token={system.token(user)}{query}")


async def test_a_client_at_a_daemon_of_another_partition_gets_421_with_its_partition(split):
    _, d0, d1, both = split
    zoe = user_in(1, "zoe")
    status, body = await refusal_of_ws(d0, zoe)
    assert (status, body["error"], body["partition"]) == (421, "wrong_partition", 1)
    answer = await poll(d0, zoe)
    assert (answer.status_code, answer.json()["error"], answer.json()["partition"]) == (421, "wrong_partition", 1)
    # The proxy's parameter, when it names another partition than the user's, is refused with the right one.
    status, body = await refusal_of_ws(d1, zoe, "&partition=0")
    assert (status, body["partition"]) == (421, 1)
    assert (await poll(both, zoe, "&partition=0")).json()["partition"] == 1
    # Served: at its partition's daemon, with or without the parameter, and at the daemon of both.
    for system, query in ((d1, ""), (d1, "&partition=1"), (both, "")):
        ws, hello = await connect(system, zoe, None)
        assert hello["cursor"].startswith("1.0.")  # partition 1 at epoch 0
        await ws.close()
        assert (await poll(system, zoe, query)).status_code == 200


async def test_a_message_between_two_partitions_reaches_every_device_of_both_once(split):
    front, d0, d1, both = split
    ann, ben = user_in(0, "ann"), user_in(1, "ben")
    for where in ("one partition per daemon", "one daemon for both"):
        ann_at, ben_at = (d0, d1) if where == "one partition per daemon" else (both, both)
        # Each device resumes after the last frame the user's devices had (its marker below), as a
        # client does: another daemon may not have reached it yet, and would send it live.
        ann_rows, ben_rows = rows_of(front, 0, ann), rows_of(front, 1, ben)
        ann_since = str(ann_rows[-1].id) if ann_rows else None
        ben_since = f"1.0.{ben_rows[-1].id}" if ben_rows else None
        anns = [(await connect(ann_at, ann, ann_since))[0] for _ in range(2)]
        bens = [(await connect(ben_at, ben, ben_since))[0] for _ in range(2)]
        reply = await post(front, ann, ben, f"hi ({where})")
        assert reply.status_code == 201, reply.text
        home_id = reply.json()["id"]  # the id the sender was answered: its partition's (0)
        for ws in anns:
            [frame] = await receive(ws, 1)
            assert (frame["id"], frame["body"], frame["cursor"]) == (home_id, f"hi ({where})", home_id)
        # The copy in ben's partition is written by that partition's writer after the original's
        # commit, and reaches ben's devices once committed: read it once they have it.
        ben_frames = [(await receive(ws, 1))[0] for ws in bens]
        copy = [r for r in rows_of(front, 1, ann) if r.body == f"hi ({where})"]
        assert [(r.origin_part, r.origin_id) for r in copy] == [(0, int(home_id))]
        for frame in ben_frames:
            assert (frame["id"], frame["from"], frame["body"], frame["cursor"]) == \
                (str(copy[0].id), ann, f"hi ({where})", f"1.0.{copy[0].id}")
        # Each user's marker travels the stream a repeat to that user would: ann's partition 0, ben's 1.
        # (A stray from the other partition's stream was fanned out with the frames already received.)
        for user, sockets, peer in ((ann, anns, user_in(0, "peer")), (ben, bens, user_in(1, "peer"))):
            assert await nothing_more_on(front, sockets, user, peer) == [[] for _ in sockets]
        for ws in anns + bens:
            await ws.close()


async def nothing_more_on(system: System, sockets: list, user: str, peer: str) -> list[list[dict]]:
    """``nothing_more`` for several devices of ``user``: one marker from ``user`` to
    ``peer``, and for each socket the frames that came before it."""
    marker = f"marker-{uuid.uuid4().hex}"
    assert (await post(system, user, peer, "marker", client_msg_id=marker)).status_code == 201
    before: list[list[dict]] = []
    for ws in sockets:
        before.append([])
        while (frame := (await receive(ws, 1))[0]).get("client_msg_id") != marker:
            before[-1].append(frame)
    return before


async def test_each_daemon_decodes_only_its_partitions_entries_through_the_relay(split):
    front, d0, d1, _ = split
    cy, dee = user_in(1, "cy"), user_in(1, "dee")
    eve, fay = user_in(0, "eve"), user_in(0, "fay")
    ws, _hello = await connect(d1, dee)
    at_d0, _hello = await connect(d0, fay)

    async def through_d0(body: str) -> None:
        """Until d0 delivers a message of partition 0 posted now: the relay sends d0 its
        share of the oplog in order, so d0 has then had all of its share written before."""
        assert (await post(front, eve, fay, body)).status_code == 201
        assert [f["body"] for f in await receive(at_d0, 1)] == [body]

    await through_d0("before")
    before = [decoded(d) for d in (d0, d1)]
    async with httpx.AsyncClient(timeout=10 * S) as client:
        for n in range(20):  # partition 1 only, one at a time: in order
            assert (await post(front, cy, dee, f"m{n}", client=client)).status_code == 201
    assert [f["body"] for f in await receive(ws, 20)] == [f"m{n}" for n in range(20)]
    await through_d0("after")  # posted once the twenty were in the oplog (d1 has them): after them
    after = [decoded(d) for d in (d0, d1)]
    # Partition 0's daemon decoded the one insert of "after", and none of the twenty.
    assert after[0] == {**before[0], "0": before[0]["0"] + 1}
    assert after[1]["1"] - before[1].get("1", 0) >= 20 and "0" not in after[1]
    for socket in (ws, at_d0):
        await socket.close()


def decoded(system: System) -> dict[str, float]:
    """``chat_daemon_oplog_entries_decoded_total`` by partition, from the daemon's /metrics."""
    text_ = httpx.get(f"http://127.0.0.1:{system.daemon_port}/metrics", timeout=10 * S).text
    found = {}
    for line in text_.splitlines():
        if line.startswith('chat_daemon_oplog_entries_decoded_total{partition="'):
            label, value = line.split('"')[1], float(line.rsplit(" ", 1)[1])
            found[label] = value
    return found


@pytest.fixture
def fresh_two_partitions(tmp_path):
    with databases(tmp_path, partitions=2) as dbs:
        yield dbs


async def test_a_partition_with_no_messages_holds_up_no_delivery_of_the_other(fresh_two_partitions):
    # Partition 1 never has a message: the daemon serving both starts, and
    # delivers partition 0's at once.
    dbs = fresh_two_partitions
    with writing_system(dbs) as front, daemon_serving(dbs, "") as both:
        eve, fay = user_in(0, "eve"), user_in(0, "fay")
        ws, hello = await connect(both, fay)
        assert hello["cursor"] == "0"
        async with httpx.AsyncClient(timeout=10 * S) as client:
            replies = [await post(front, eve, fay, f"m{n}", client=client) for n in range(5)]
        frames = await receive(ws, 5, timeout=10 * S)
        assert [f["body"] for f in frames] == [f"m{n}" for n in range(5)]
        assert frames[-1]["cursor"] == replies[-1].json()["id"] == "5"
        health = httpx.get(f"http://127.0.0.1:{both.daemon_port}/healthz", timeout=10 * S).json()
        assert health["partitions"] == {"0": "5", "1": "1.0.0"}
        await ws.close()


async def test_client_config_tells_the_token_s_user_its_partition_and_nobody_else(split):
    front = split[0]
    ann, ben = user_in(0, "ann"), user_in(1, "ben")
    async with httpx.AsyncClient(timeout=10 * S) as client:
        url = f"{front.api_url}/v1/client-config"
        anonymous = await client.get(url)
        as_ann = await client.get(url, headers={"Authorization": f"Bearer {front.token(ann)}"})
        as_ben = await client.get(url, headers={"Authorization": f"Bearer {front.token(ben)}"})
        forged = await client.get(url, headers={"Authorization": "Bearer not-a-token"})
    assert anonymous.status_code == 200 and "partition" not in anonymous.json()
    assert (as_ann.json()["partition"], as_ben.json()["partition"]) == (0, 1)
    assert as_ben.json() == {**anonymous.json(), "partition": 1}
    assert (forged.status_code, forged.json()["error"]) == (401, "unauthorized")


@pytest.fixture(scope="module")
def behind_front_door(split):
    """nginx routing ``?partition=k`` to partition k's daemon; without it, to partition 0's."""
    if not front_door.available():
        pytest.skip("nginx is not installed")
    _, d0, d1, _ = split
    with front_door.front_door(d0.daemon_port, {0: d0.daemon_port, 1: d1.daemon_port}) as url:
        yield url


def test_chatctl_listen_follows_a_421_to_its_partition_and_resumes_with_cursors(split, behind_front_door):
    front, url = split[0], behind_front_door
    ann, ben = user_in(0, "ann"), user_in(1, "ben")
    for body in ("one", "two"):
        sent = chatctl(front, "send", "--as", ann, "--api", front.api_url, ben, body)
        assert sent.returncode == 0, sent.stderr
    # From partition 1's start (epoch 0, position 0): ben's two, whatever else the partition holds.
    listened = chatctl(front, "listen", "--as", ben, "--url", url, "--since", "1.0.0", "--count", "2")
    assert listened.returncode == 0, listened.stderr
    # Refused by partition 0's daemon, it asked the API too, which named the same partition as the 421.
    assert listened.stderr == "chatctl listen: partition 1 (from the API), resuming from 1.0.0\n"
    frames = [orjson.loads(line) for line in listened.stdout.splitlines()]
    assert [(f["from"], f["to"], f["body"]) for f in frames] == [(ann, ben, "one"), (ann, ben, "two")]
    assert [f["cursor"] for f in frames] == [f"1.0.{f['id']}" for f in frames]
    # Resuming from the first one's cursor gives the second only.
    again = chatctl(front, "listen", "--as", ben, "--url", url, "--since", frames[0]["cursor"], "--count", "1")
    assert [orjson.loads(line) for line in again.stdout.splitlines()] == frames[1:]


async def test_a_burst_past_the_stream_queues_of_a_daemon_of_two_partitions_waits_in_the_oplog_and_loses_nothing(
        split, monkeypatch):
    # A daemon serving both partitions, tailing on its own: one oplog tail split
    # by the fanout (oplog/fanout.py) between the two streams. Both consumers are
    # held at their first read of MySQL while a burst many times their queues is
    # committed: the readers stop at the streams' bound, the fanout's queues at
    # theirs, and the rest waits in the stores, not in the daemon. Let go, every
    # message reaches its recipient once, in order: MySQL's rows of it.
    from daemon import partition_streams, tail_reader
    from db import mongo
    from db.stream_ranges import StreamRanges
    from oplog import fanout as fanout_module
    from oplog.tail import OplogTail
    from tests.e2e.test_oplog_tail import _Recorder, reach

    front = split[0]
    per_partition = 60
    monkeypatch.setattr(tail_reader, "TAIL_QUEUE_MAX", 10)
    monkeypatch.setattr(fanout_module, "VIEW_QUEUE_MAX", 2)
    # One entry a batch: the burst comes as many batches, as a busy oplog's does.
    monkeypatch.setattr(partition_streams, "OplogTail", functools.partial(OplogTail, batch_size=1))
    let_go = asyncio.Event()
    let_go.set()
    confirm = StreamRanges.confirm

    async def held_confirm(self, after, upto):
        await let_go.wait()
        return await confirm(self, after, upto)

    monkeypatch.setattr(StreamRanges, "confirm", held_confirm)
    for key, value in {**front.env, "CHAT_OPLOG_RELAY_SOCKET": "", "CHAT_DAEMON_PARTITIONS": ""}.items():
        monkeypatch.setenv(key, value)
    settings = Settings(_env_file=None)
    client = mongo.make_client(settings.stores.mongo_url.get_secret_value(), settings.stores.db_timeout_seconds)
    parts = await partition_streams.build(settings, client)
    loops = [asyncio.create_task(loop) for loop in parts.loops]
    try:
        assert parts.fanout is not None and sorted(parts.streams) == [0, 1]
        views = list(parts.fanout.views.values())
        for stream in parts.streams.values():
            await asyncio.wait_for(stream.ready.wait(), PATIENCE)
        senders = {k: user_in(k, "ann") for k in (0, 1)}
        recipients = {k: _Recorder(user_in(k, "bob"), parts.streams[k].position) for k in (0, 1)}
        for k, bob in recipients.items():
            parts.streams[k].consumer.hub.register(bob.subscriber)
            bob.subscriber.go_live([])
        let_go.clear()
        async with httpx.AsyncClient(timeout=PATIENCE) as http:
            for n in range(per_partition):
                for k in (0, 1):
                    reply = await post(front, senders[k], recipients[k].subscriber.user, f"burst {n}", client=http)
                    assert reply.status_code == 201, reply.text
        await eventually(lambda: any(view.queue.full() for view in views), "the fanout waits at a full queue")
        rows = {k: rows_of(front, k, senders[k]) for k in (0, 1)}
        assert [len(rows[k]) for k in (0, 1)] == [per_partition] * 2  # all committed meanwhile
        # What the daemon holds of the burst (an entry a batch): the bounds, and nothing past them.
        held = [(stream.inbox.entries, view.queue.qsize()) for stream, view in zip(parts.streams.values(), views,
                                                                                  strict=True)]
        assert all(entries <= 10 and batches <= 2 for entries, batches in held), held
        let_go.set()
        for k, stream in parts.streams.items():
            await reach(stream, rows[k][-1].id)
            assert recipients[k].got == [row.id for row in rows[k]]
            assert [row.body for row in rows[k]] == [f"burst {n}" for n in range(per_partition)]
    finally:
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await client.close()
        parts.close()
