"""Fixtures the relay's tests share."""

import pytest

from db import mongo


@pytest.fixture
def path(tmp_path) -> str:
    """Where a test's relay listens."""
    return str(tmp_path / "relay.sock")


@pytest.fixture
async def client():
    """A Mongo client for RelayTail's codec options: nothing here connects to it."""
    c = mongo.make_client("mongodb://127.0.0.1:9", 1)
    yield c
    await c.close()
