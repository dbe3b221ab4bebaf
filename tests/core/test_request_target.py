"""A daemon reads the path and query of a request target in both forms a
client or proxy may send (RFC 9112, 3.2): origin form and absolute form."""

import pytest

from daemon.admission import parse_since, split_target


@pytest.mark.parametrize("target", [b"/v1/poll?since=42&limit=%C2%B2&timeout=",
                                    b"http://chat.example:8100/v1/poll?since=42&limit=%C2%B2&timeout="])
def test_both_target_forms_give_the_same_path_and_query(target):
    # blank values are absent; percent-escapes are decoded as UTF-8
    assert split_target(target) == ("/v1/poll", {"since": "42", "limit": "²"})


def test_a_path_without_query():
    assert split_target(b"/v1/ws") == ("/v1/ws", {})


@pytest.mark.parametrize(("raw", "since"), [("42", 42), ("0", 0), ("²", None), ("-1", None), ("4" * 20, None),
                                            ("9" * 19, None), (str(2**63 - 1), 2**63 - 1), ("", None), (None, None),
                                            ("1e3", None)])
def test_since_is_a_decimal_id_or_unknown(raw, since):
    assert parse_since(raw) == since
