"""Which users' catch-up ranges one read of MySQL answers, and each one's rows out of it
(``db.stream_ranges.one_read``, ``answers``): pure, on made-up rows."""

from db.stream_ranges import UserRange, answers, one_read


def doc(msg_id: int, sender: str, recipient: str) -> dict:
    return {"_id": msg_id, "from": sender, "to": recipient}


def test_one_read_takes_the_oldest_and_every_range_that_keeps_it_within_its_span_up_to_its_most():
    asked = [UserRange("a", 100, 200, 10), UserRange("b", 0, 900, 10), UserRange("c", 150, 300, 10),
             UserRange("d", 50, 250, 10), UserRange("e", 60, 120, 10)]
    assert one_read(asked, span=300, most=10) == [0, 2, 3, 4]  # b would make it 900 ids
    assert one_read(asked, span=300, most=2) == [0, 2]
    assert one_read(asked[1:], span=300, most=10) == [0]  # a long range is read alone


def test_each_range_gets_its_users_rows_within_its_ids_oldest_first_at_most_its_limit():
    docs = [doc(1, "a", "b"), doc(2, "b", "c"), doc(3, "a", "a"), doc(4, "c", "a"), doc(5, "a", "b")]
    asked = [UserRange("a", 0, 5, 10), UserRange("a", 1, 4, 1), UserRange("b", 1, 5, 10), UserRange("z", 0, 5, 10)]
    assert [[d["_id"] for d in found] for found in answers(docs, asked)] == [[1, 3, 4, 5], [3], [2, 5], []]
