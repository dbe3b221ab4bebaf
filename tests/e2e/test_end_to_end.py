"""The foundation's promise: a message POSTed to the API arrives on the
recipient's WebSocket, through MySQL, MongoDB, the oplog and a daemon."""

from tests.e2e.helpers import connect, mongo_docs, mysql_rows, post, receive


async def test_a_posted_message_arrives_on_the_recipients_websocket(system, users):
    alice, bob = users("alice"), users("bob")
    ws, hello = await connect(system, bob)
    try:
        assert hello["recovered"] is False and hello["cursor"].isdigit()
        reply = await post(system, alice, bob, "hello bob", client_msg_id="c-1")
        assert reply.status_code == 201
        stored = reply.json()
        assert stored["from"] == alice and stored["to"] == bob and stored["body"] == "hello bob"

        [frame] = await receive(ws, 1)
        assert frame == stored  # the same JSON the API answered, byte-for-byte fields

        [row] = mysql_rows(system, "sender = :s", s=alice)
        assert (str(row.id), row.recipient, row.body, row.client_msg_id) == (stored["id"], bob, "hello bob", "c-1")
        [doc] = mongo_docs(system, {"from": alice})
        assert (str(doc["_id"]), doc["to"], doc["body"]) == (stored["id"], bob, "hello bob")
    finally:
        await ws.close()
