"""The hot-path benchmark (loadtest/hotpath.py) drives the daemon's real release path."""

import asyncio

from loadtest import hotpath


def test_every_message_reaches_its_recipients_connection_once():
    result = asyncio.run(hotpath.one_round(clients=50, count=2000, batch=100))
    assert result["frames"] == 2000  # one_round also stops if the stream's position is short


def test_the_batches_are_the_ids_in_order_one_recipient_each():
    batches = hotpath.oplog_batches(clients=10, count=250, batch=100)
    assert [len(b.entries) for b in batches] == [100, 100, 50]
    assert [e["o"]["_id"] for b in batches for e in b.entries] == list(range(1, 251))
    assert all(e["o"]["to"].startswith("r") and e["o"]["from"].startswith("x") for b in batches for e in b.entries)
