"""The pure parts of events (docs/receipts.md): the writer's rules, the shapes
a row takes on its way to a socket, and a daemon's cache holding the latest version."""

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from chat.drafts import Draft
from chat.messages import Kind, Message, encode_doc, is_message_doc, shown_digest
from chat.write_errors import (
    EditWindowClosed,
    MessageDeleted,
    MessageNotFound,
    NotInConversation,
    NotSender,
    PastNewest,
)
from daemon.recent_cache import RecentCache
from writer.events import Facts, Referenced, delivered_rows, judge_ack, judge_read, judge_revision, revised

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
WINDOW = 48 * 3600


def facts() -> Facts:
    f = Facts(last_id=10)
    f.refs = {
        3: Referenced("ann", "ben", Kind.MESSAGE, False, NOW - timedelta(hours=1)),  # ann -> ben
        4: Referenced("ben", "ann", Kind.MESSAGE, False, NOW - timedelta(hours=1)),  # ben -> ann
        5: Referenced("ann", "ben", Kind.MESSAGE, True, NOW - timedelta(hours=1)),  # deleted
        6: Referenced("ann", "ben", Kind.MESSAGE, False, NOW - timedelta(hours=49)),  # old
        7: Referenced("ann", "ben", Kind.EDIT, False, NOW),  # an event, not a message
        8: Referenced("cy", "ann", Kind.MESSAGE, False, NOW),
    }
    f.peer_newest = {("ann", "ben", 3): 0}
    return f


def edit(sender: str, ref: int) -> Draft:
    return Draft(sender, "", "new", None, Kind.EDIT, ref)


@pytest.mark.parametrize("draft, refusal", [
    (edit("ben", 3), NotSender),
    (edit("ann", 5), MessageDeleted),
    (edit("ann", 6), EditWindowClosed),
    (edit("ann", 7), MessageNotFound),
    (edit("ann", 99), MessageNotFound),
])
def test_an_edit_breaking_a_rule_is_refused(draft, refusal):
    with pytest.raises(refusal):
        judge_revision(draft, facts(), NOW, WINDOW)


def test_a_delete_is_seen_by_the_rest_of_its_batch():
    f = facts()
    original = judge_revision(Draft("ann", "", "", None, Kind.DELETE, 3), f, NOW, WINDOW)
    assert original.recipient == "ben"
    revised(original, Kind.DELETE)
    with pytest.raises(MessageDeleted):
        judge_revision(edit("ann", 3), f, NOW, WINDOW)


@pytest.mark.parametrize("reader, peer, upto, refusal", [
    ("ben", "ann", 11, PastNewest),
    ("ben", "ann", 9, MessageNotFound),  # within the stream, not a row of it here
    ("ben", "ann", 7, MessageNotFound),  # an event
    ("ben", "cy", 3, NotInConversation),
    ("ann", "ben", 8, NotInConversation),
    ("ben", "ann", 5, MessageDeleted),
])
def test_a_read_marker_breaking_a_rule_is_refused(reader, peer, upto, refusal):
    with pytest.raises(refusal):
        judge_read(Draft(reader, peer, "", None, Kind.READ, upto), facts())


def test_a_read_marker_is_the_newest_message_from_the_peer_at_or_below_it():
    f = facts()
    assert judge_read(Draft("ben", "ann", "", None, Kind.READ, 3), f) == 3  # ann's own message
    assert judge_read(Draft("ann", "ben", "", None, Kind.READ, 4), f) == 4
    assert judge_read(Draft("ann", "ben", "", None, Kind.READ, 3), f) == 0  # ann's, and ben sent nothing before


def test_an_ack_past_the_newest_id_is_refused():
    judge_ack(Draft("ben", "phone", "", None, Kind.ACK, 10), facts())
    with pytest.raises(PastNewest):
        judge_ack(Draft("ben", "phone", "", None, Kind.ACK, 11), facts())


def test_a_user_s_acks_write_one_delivered_per_peer_whose_messages_they_passed():
    f = Facts(last_id=20, passed={"ben": {"ann": 12, "cy": 15}})
    assert delivered_rows("ben", f, 10, 20) == [("ann", 12), ("cy", 15)]
    assert delivered_rows("ben", f, 12, 14) == []  # ann's 12 was passed before
    assert delivered_rows("ben", f, 20, 20) == []


def test_each_kind_has_its_frame_and_a_revised_message_its_latest_version():
    created = NOW
    frames = {k: orjson.loads(encode_doc(Message(9, "ann", "ben", "b", created, "k", kind=k, ref_id=3).to_doc())[4])
              for k in (Kind.EDIT, Kind.DELETE, Kind.READ, Kind.DELIVERED)}
    assert frames[Kind.EDIT] == {"type": "edit", "id": "9", "from": "ann", "to": "ben", "ref": "3", "body": "b",
                                 "created_at": "2026-11-26T12:00:00.000Z", "client_msg_id": "k"}
    assert frames[Kind.DELETE] == {"type": "delete", "id": "9", "from": "ann", "to": "ben", "ref": "3",
                                   "created_at": "2026-11-26T12:00:00.000Z", "client_msg_id": "k"}
    assert frames[Kind.READ] == {"type": "read", "id": "9", "from": "ann", "to": "ben", "upto": "3",
                                 "created_at": "2026-11-26T12:00:00.000Z"}
    assert frames[Kind.DELIVERED]["type"] == "delivered"
    tombstone = Message(3, "ann", "ben", "", created, None, deleted=True).to_doc()
    assert orjson.loads(encode_doc(tombstone)[4])["deleted"] is True
    plain = Message(3, "ann", "ben", "hi", created).to_doc()
    assert "kind" not in plain and is_message_doc(plain)  # a message's document is as it always was


def test_a_document_claiming_to_be_an_event_is_checked_and_its_reference_is_in_the_digest():
    doc = Message(9, "ann", "ben", "", NOW, None, kind=Kind.READ, ref_id=3).to_doc()
    assert is_message_doc(doc)
    assert not is_message_doc({**doc, "kind": 9})
    assert not is_message_doc({**doc, "ref": "3"})
    assert not is_message_doc({**doc, "deleted": "yes"})
    assert shown_digest(doc) != shown_digest({**doc, "ref": 4})


def test_the_recent_cache_holds_an_edited_or_deleted_message_in_its_latest_version():
    cache = RecentCache(10)
    cache.extend([Message(i, "ann", "ben", f"m{i}", NOW).to_doc() for i in (1, 2, 3)])
    cache.revise(Message(4, "ann", "ben", "m2!", NOW, None, kind=Kind.EDIT, ref_id=2).to_doc())
    cache.revise(Message(5, "ann", "ben", "", NOW, None, kind=Kind.DELETE, ref_id=3).to_doc())
    cache.revise(Message(6, "ann", "ben", "late", NOW, None, kind=Kind.EDIT, ref_id=3).to_doc())  # deleted stays
    cache.revise(Message(7, "ann", "ben", "", NOW, None, kind=Kind.DELETE, ref_id=99).to_doc())  # not held
    bodies = [(orjson.loads(e[4])["body"], orjson.loads(e[4]).get("deleted", False)) for e in cache.between(0, 3)]
    assert bodies == [("m1", False), ("m2!", False), ("", True)]
    assert orjson.loads(cache.between(1, 2)[0][4])["edited_at"] == "2026-11-26T12:00:00.000Z"
