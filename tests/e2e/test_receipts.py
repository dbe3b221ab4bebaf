"""Receipts, read markers, unread counts, edits and deletes (docs/receipts.md), end to end:
what each device gets on its socket, what MySQL and Mongo hold, and every refusal."""

import httpx
import orjson
import pytest
import websockets
from sqlalchemy import create_engine, text

from tests.e2e.helpers import connect, mongo_docs_soon, mysql_rows, post, receive
from tests.timing import PATIENCE


def auth(system, user: str) -> dict:
    return {"Authorization": f"Bearer {system.token(user)}"}


async def call(system, user: str, method: str, path: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        return await client.request(method, f"{system.api_url}{path}", headers=auth(system, user), **kwargs)


async def send(system, sender: str, to: str, body: str) -> str:
    r = await post(system, sender, to, body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def sql(system, statement: str, **params) -> list:
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return result.all() if result.returns_rows else []
    finally:
        engine.dispose()


async def conversation_with(system, user: str, peer: str) -> dict:
    r = await call(system, user, "GET", "/v1/conversations")
    assert r.status_code == 200, r.text
    return next(c for c in r.json()["conversations"] if c["with"] == peer)


async def test_an_edit_and_a_delete_reach_every_device_once_and_history_keeps_the_latest(system, users):
    alice, bob = users("alice"), users("bob")
    bob_ws, _ = await connect(system, bob)
    alice_ws, _ = await connect(system, alice)
    msg_id = await send(system, alice, bob, "helo")
    assert [f["id"] for f in await receive(bob_ws, 1)] == [msg_id]
    await receive(alice_ws, 1)

    r = await call(system, alice, "PATCH", f"/v1/messages/{msg_id}", json={"body": "hello", "client_msg_id": "e-1"})
    assert r.status_code == 201, r.text
    edit = r.json()
    assert (edit["type"], edit["ref"], edit["body"], edit["from"], edit["to"]) == ("edit", msg_id, "hello", alice, bob)
    for ws in (bob_ws, alice_ws):
        assert await receive(ws, 1) == [edit]
    again = await call(system, alice, "PATCH", f"/v1/messages/{msg_id}", json={"body": "hello", "client_msg_id": "e-1"})
    assert (again.status_code, again.json()) == (200, edit)  # a retry: the same event, not a second one

    r = await call(system, alice, "DELETE", f"/v1/messages/{msg_id}")
    assert r.status_code == 201, r.text
    deleted = r.json()
    assert (deleted["type"], deleted["ref"]) == ("delete", msg_id) and "body" not in deleted
    for ws in (bob_ws, alice_ws):
        assert await receive(ws, 1) == [deleted]

    history = (await call(system, bob, "GET", "/v1/messages", params={"with": alice})).json()["messages"]
    assert [(m["id"], m["body"], m.get("deleted")) for m in history] == [(msg_id, "", True)]
    row = mysql_rows(system, "id = :id", id=int(msg_id))[0]
    assert (row.body, row.deleted, row.edited_at is not None) == ("", 1, True)
    [doc] = await mongo_docs_soon(system, {"_id": int(msg_id), "deleted": True}, 1)
    assert doc["body"] == ""
    # A device that resumes from before the message gets its tombstone, then both events, in order.
    late, _ = await connect(system, bob, since=str(int(msg_id) - 1))
    frames = await receive(late, 3)
    assert [(f["type"], f["id"]) for f in frames] == [("message", msg_id), ("edit", edit["id"]),
                                                      ("delete", deleted["id"])]
    assert (frames[0]["body"], frames[0]["deleted"]) == ("", True)
    for ws in (bob_ws, alice_ws, late):
        await ws.close()


async def test_a_read_marker_clears_unread_on_every_device_and_ticks_the_sender(system, users):
    alice, bob = users("alice"), users("bob")
    phone, _ = await connect(system, bob)
    laptop, _ = await connect(system, bob)
    alice_ws, _ = await connect(system, alice)
    ids = [await send(system, alice, bob, f"m{i}") for i in range(3)]
    for ws in (phone, laptop, alice_ws):
        assert [f["id"] for f in await receive(ws, 3)] == ids
    _ws, hello = await connect(system, bob)
    assert hello["unread"] == 3
    await _ws.close()
    assert (await conversation_with(system, bob, alice))["unread"] == 3

    await phone.send(orjson.dumps({"type": "read", "peer": alice, "upto": ids[1]}).decode())
    [on_laptop] = await receive(laptop, 1)
    assert (on_laptop["type"], on_laptop["from"], on_laptop["to"], on_laptop["upto"]) == ("read", bob, alice, ids[1])
    assert await receive(phone, 1) == [on_laptop]
    [ticked] = await receive(alice_ws, 1)
    assert (ticked["type"], ticked["upto"]) == ("read", ids[1])
    conversation = await conversation_with(system, bob, alice)
    assert (conversation["unread"], conversation["read_upto"]) == (1, ids[1])
    assert (await conversation_with(system, alice, bob))["peer_read_upto"] == ids[1]

    older = await call(system, bob, "POST", "/v1/read", json={"peer": alice, "upto": ids[0]})
    assert older.json() == {"peer": alice, "upto": ids[1], "unread": 1}  # a marker only moves forward
    newest = await call(system, bob, "POST", "/v1/read", json={"peer": alice, "upto": ids[2]})
    assert newest.json() == {"peer": alice, "upto": ids[2], "unread": 0}
    assert [f["upto"] for f in await receive(laptop, 1)] == [ids[2]]  # the older one wrote nothing
    assert sql(system, "SELECT upto FROM read_markers WHERE reader = :r AND peer = :p", r=bob, p=alice) == [
        (int(ids[2]),)]
    _ws, hello = await connect(system, bob)
    assert hello["unread"] == 0
    for ws in (phone, laptop, alice_ws, _ws):
        await ws.close()


async def test_acks_from_a_device_become_one_delivered_up_to_for_the_sender(system, users):
    alice, bob = users("alice"), users("bob")
    alice_ws, _ = await connect(system, alice)
    phone = await websockets.connect(f"{system.ws_url}/v1/ws?device=phone-1", additional_headers=auth(system, bob))
    assert orjson.loads(await phone.recv())["type"] == "hello"
    ids = [await send(system, alice, bob, f"m{i}") for i in range(3)]
    got = await receive(phone, 3)
    await receive(alice_ws, 3)
    for frame in got:  # one ack per frame: coalesced on the way, "up to" the newest
        await phone.send(orjson.dumps({"type": "ack", "upto": frame["id"]}).decode())
    delivered = []
    while not delivered or delivered[-1]["upto"] != ids[-1]:
        [frame] = await receive(alice_ws, 1)
        assert (frame["type"], frame["from"], frame["to"]) == ("delivered", bob, alice)
        delivered.append(frame)
    assert [f["upto"] for f in delivered] == sorted({f["upto"] for f in delivered}, key=int)  # only ever up
    assert sql(system, "SELECT device, upto FROM device_acks WHERE user = :u", u=bob) == [("phone-1", int(ids[-1]))]
    r = await call(system, bob, "POST", "/v1/acks", json={"upto": ids[0], "device": "phone-1"})
    assert r.json() == {"device": "phone-1", "upto": ids[-1]}  # an older ack moves nothing
    await phone.close()
    await alice_ws.close()


async def test_refusals_have_their_documented_answers(system, users):
    alice, bob, carol = users("alice"), users("bob"), users("carol")
    msg_id = await send(system, alice, bob, "hi")
    other = await send(system, carol, alice, "psst")

    async def answer(user, method, path, **kwargs):
        r = await call(system, user, method, path, **kwargs)
        return r.status_code, r.json().get("error")

    assert await answer(bob, "PATCH", f"/v1/messages/{msg_id}", json={"body": "x"}) == (403, "not_sender")
    assert await answer(bob, "DELETE", f"/v1/messages/{msg_id}") == (403, "not_sender")
    assert await answer(alice, "POST", "/v1/read", json={"peer": bob, "upto": other}) == (403, "not_in_conversation")
    assert await answer(bob, "POST", "/v1/read", json={"peer": alice, "upto": str(2**62)}) == (422, "past_newest")
    assert await answer(bob, "POST", "/v1/acks", json={"upto": str(2**62)}) == (422, "past_newest")
    assert await answer(alice, "PATCH", "/v1/messages/9000000000000", json={"body": "x"}) == (404, "message_not_found")
    assert await answer(alice, "PATCH", f"/v1/messages/{msg_id}", json={"body": ""}) == (422, "invalid_field")
    assert await answer(alice, "PATCH", f"/v1/messages/{msg_id}", content=b"{") == (400, "malformed_json")
    assert await answer(alice, "POST", "/v1/read", json={"peer": bob, "upto": 5, "x": 1}) == (422, "invalid_field")
    assert (await call(system, alice, "PATCH", f"/v1/messages/{msg_id}", json={"body": "x" * 20000})).status_code == 413

    old = await send(system, alice, bob, "from long ago")
    sql(system, "UPDATE messages SET created_at = created_at - INTERVAL 3 DAY WHERE id = :id", id=int(old))
    assert await answer(alice, "PATCH", f"/v1/messages/{old}", json={"body": "x"}) == (409, "edit_window_closed")

    assert (await call(system, alice, "DELETE", f"/v1/messages/{msg_id}")).status_code == 201
    assert await answer(alice, "PATCH", f"/v1/messages/{msg_id}", json={"body": "x"}) == (409, "message_deleted")
    assert await answer(alice, "DELETE", f"/v1/messages/{msg_id}") == (409, "message_deleted")
    assert await answer(bob, "POST", "/v1/read", json={"peer": alice, "upto": msg_id}) == (409, "message_deleted")
    # nothing of the refused was stored: the conversation holds the two messages and one delete
    kinds = [r.kind for r in mysql_rows(system, "conversation = :c", c="\x00".join(sorted((alice, bob))))]
    assert kinds == [0, 0, 2]


@pytest.mark.parametrize("frame, reason", [
    (b'{"type": "ack", "upto": 5}', "upto must be a message id (a decimal string)"),
    (b'{"type": "ack", "upto": "0"}', "upto must be a message id (a decimal string)"),
    (b'{"type": "read", "upto": "5"}', "read frame fields are type, peer, upto"),
    (b'{"type": "read", "peer": "a b", "upto": "5"}', "peer must be a user id"),
])
async def test_a_malformed_client_frame_closes_with_1007(system, users, frame, reason):
    ws, _ = await connect(system, users("bob"))
    for other in ("not json", "[1]", '{"kind": "typing"}'):  # not a client frame: checked and dropped
        await ws.send(other)
    await ws.send(frame.decode())
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            await ws.recv()
    assert (ws.close_code, ws.close_reason) == (1007, reason)


async def test_a_refused_frame_is_an_error_frame_and_the_socket_stays_open(system, users):
    alice, bob, carol = users("alice"), users("bob"), users("carol")
    ws, _ = await connect(system, alice)
    other = await send(system, carol, alice, "psst")
    assert [f["id"] for f in await receive(ws, 1)] == [other]
    await ws.send(orjson.dumps({"type": "read", "peer": bob, "upto": other}).decode())
    frames = await receive(ws, 1)
    assert frames == [{"type": "error", "code": "not_in_conversation", "frame": "read",
                       "message": "this message is not between you and peer"}]
    msg_id = await send(system, bob, alice, "still here")
    assert [f["id"] for f in await receive(ws, 1)] == [msg_id]
    await ws.close()
