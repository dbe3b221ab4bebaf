"""Fixtures: real MariaDB and FerretDB on free ports, and the system as real
processes. Nothing here fakes a database."""

from __future__ import annotations

import uuid

import pytest

from harness.system import databases, running_system


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath) or "/browser/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("dbs")) as d:
        yield d


@pytest.fixture(scope="session")
def system(dbs):
    """The shared system as supervisord.conf deploys it: one writer process,
    one relay, one API process and two daemons on one port."""
    with running_system(dbs, daemons=2, apis=1, writer=True, relay=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_API_HEAD_TIMEOUT_SECONDS="2") as s:
        yield s


@pytest.fixture
def users():
    """Fresh user ids per test, so tests never see each other's messages."""
    tag = uuid.uuid4().hex[:8]

    def make(name: str) -> str:
        return f"{name}-{tag}"

    return make
