"""The WebSocket load generator fails a run that sent less than it names."""

import pytest

from loadtest.wsload import verify

CLEAN = {"clients": 10, "held": 10, "lost": 0, "duplicates": 0, "asked": 100, "sent": 100, "refused": 0,
         "refused_examples": []}


def test_a_clean_run_passes():
    verify(dict(CLEAN), "run")


@pytest.mark.parametrize("change, says", [
    ({"sent": 70, "refused": 30, "refused_examples": ["409 client_msg_id_conflict"]}, "70 of 100 messages stored"),
    ({"sent": 99}, "99 of 100 messages stored"),
    ({"lost": 1}, "1 lost"),
    ({"held": 9}, "9/10 held"),
])
def test_a_run_that_sent_less_lost_or_held_fewer_fails(change, says):
    with pytest.raises(SystemExit, match=says):
        verify({**CLEAN, **change}, "run")
