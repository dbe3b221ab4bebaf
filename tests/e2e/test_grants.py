"""deploy/mysql/grants.sql on a real MariaDB grown to three partitions: each account can do
what its processes do on every partition's tables, and no more."""

import subprocess

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError, ProgrammingError

from chatctl import partitions
from harness.servers import ROOT
from harness.system import databases
from tests.timing import PATIENCE


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    # Laid out with two partitions (the layout other modules start from too: its template is
    # built once), then grown to three as an operator does before running grants.sql again:
    # its loop over the partitions' tables has two of each to grant.
    with databases(tmp_path_factory.mktemp("grants"), partitions=2) as dbs:
        partitions.grow(dbs.settings(), 3)
        with open(ROOT / "deploy/mysql/grants.sql") as grants:
            applied = subprocess.run(["mariadb", "-u", "root", f"--socket={dbs.mariadb.socket}",
                                      "--init-command=SET @api_pw='api-pw', @migrate_pw='migrate-pw', "
                                      "@daemon_pw='daemon-pw'"],
                                     stdin=grants, capture_output=True, text=True, timeout=PATIENCE)
        assert applied.returncode == 0, applied.stderr
        yield dbs


def run_as(dbs, user: str, password: str, sql: str):
    engine = create_engine(f"mysql+mysqldb://{user}:{password}@localhost/chat?unix_socket={dbs.mariadb.socket}")
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql))
            return result.all() if result.returns_rows else None
    finally:
        engine.dispose()


def test_the_api_account_writes_every_partition_and_its_echoes(three):
    for sql in ("SELECT slot_map FROM partition_map", "SELECT last_id FROM stream_state_p2",
                "INSERT INTO echoes (to_part, from_part, from_id) VALUES (2, 1, 1)",
                "DELETE FROM echoes WHERE to_part = 2", "SELECT id FROM messages_p1"):
        run_as(three, "chat_api", "api-pw", sql)
    with pytest.raises((OperationalError, ProgrammingError)):  # no DELETE of messages, in any partition
        run_as(three, "chat_api", "api-pw", "DELETE FROM messages_p2")


def test_the_daemon_account_reads_every_partition_and_writes_nothing(three):
    assert run_as(three, "chat_daemon", "daemon-pw", "SELECT id FROM messages_p2") == []
    run_as(three, "chat_daemon", "daemon-pw", "SELECT slot_map FROM partition_map")
    with pytest.raises((OperationalError, ProgrammingError)):
        run_as(three, "chat_daemon", "daemon-pw", "SELECT from_id FROM echoes")

