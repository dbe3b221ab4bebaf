"""The reference client's pure rules: what it resumes with, what it drops as a repeat, where a 421 sends it."""

import orjson
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Response

from chatctl.client import Inbox, partition_of_refusal


def message(msg_id: str, cursor: str | None = None) -> dict:
    frame = {"type": "message", "id": msg_id, "from": "ann", "to": "ben", "body": "x"}
    return frame if cursor is None else {**frame, "cursor": cursor}


def test_it_resumes_with_the_frames_cursor_when_there_is_one_else_the_id():
    inbox = Inbox()
    inbox.accept({"type": "hello", "cursor": "1.2.5", "recovered": False})
    assert inbox.accept(message("6", "1.2.6"))
    assert inbox.since == "1.2.6"
    assert inbox.query() == "since=1.2.6"
    single = Inbox()
    assert single.accept(message("7"))
    assert single.since == "7"


def test_after_recovered_false_the_ids_of_another_partition_are_new_messages():
    inbox = Inbox("0.0.3")
    for n in (1, 2, 3):
        inbox.accept(message(str(n)))
    # The user's slot moved: partition 1 numbers its own messages from 1 again.
    inbox.accept({"type": "hello", "cursor": "1.1.0", "recovered": False})
    assert inbox.accept(message("1", "1.1.1")) and inbox.accept(message("2", "1.1.2"))
    assert inbox.accept(message("2", "1.1.2")) is False and inbox.duplicates == 1  # a true repeat still drops
    assert inbox.ids == [1, 2, 3, 1, 2]


def test_a_421_names_the_partition_to_route_to():
    def refusal(status: int, body: object) -> InvalidStatus:
        return InvalidStatus(Response(status, "x", Headers(), orjson.dumps(body)))

    assert partition_of_refusal(refusal(421, {"error": "wrong_partition", "partition": 3})) == 3
    assert partition_of_refusal(refusal(503, {"error": "draining"})) is None
    assert partition_of_refusal(refusal(421, {"error": "wrong_partition"})) is None
    assert partition_of_refusal(refusal(421, {"partition": "3"})) is None
    inbox = Inbox(partition=3)
    assert inbox.query() == "partition=3"
