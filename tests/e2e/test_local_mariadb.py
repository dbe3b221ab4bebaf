"""The test harness's MariaDB servers share a machine, and test workers start
them side by side."""

import tempfile
import uuid
from pathlib import Path

from harness.system import databases


def test_a_starting_mariadb_leaves_other_servers_temporary_tables_alone(tmp_path):
    # A starting mariadbd deletes every #sql* file in its tmpdir. In the shared
    # /tmp those were the temporary tables of a neighbouring worker's
    # mariadb-install-db, which then failed with "Unknown table tmp_user_sys".
    neighbour = Path(tempfile.gettempdir()) / f"#sql-temptable-{uuid.uuid4().hex}.MAI"
    neighbour.write_bytes(b"a neighbour's temporary table")
    try:
        with databases(tmp_path) as dbs:
            assert dbs.mariadb.proc is not None and dbs.mariadb.proc.poll() is None
            assert neighbour.read_bytes() == b"a neighbour's temporary table"
    finally:
        neighbour.unlink(missing_ok=True)
