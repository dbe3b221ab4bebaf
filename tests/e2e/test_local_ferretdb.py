"""The local stand-in for MongoDB runs as README and scripts/ferretdb.sh say."""

from pathlib import Path

from harness.servers import FERRETDB_GC, ROOT


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def test_ferretdb_collects_garbage_as_make_run_has_it(dbs):
    # the tests' FerretDB and make run's (scripts/ferretdb.sh) run the same Go GC settings
    running = environ_of(dbs.ferretdb.proc.pid)
    assert {k: running.get(k) for k in FERRETDB_GC} == FERRETDB_GC
    script = (ROOT / "scripts/ferretdb.sh").read_text()
    assert f"export GOGC={FERRETDB_GC['GOGC']} GOMEMLIMIT={FERRETDB_GC['GOMEMLIMIT']}\n" in script
