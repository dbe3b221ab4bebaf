#!/usr/bin/env bash
# The development FerretDB under supervisord: SQLite files in var/ferretdb,
# 127.0.0.1:27017, replica-set name rs0. Flags (docs/ferretdb.md): no
# debug port, state beside the data, fast capped-collection cleanup so the
# small local oplog stays small.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$PWD/var/ferretdb"
# Go's collector ran a sixth of FerretDB's CPU under load: collect at 16x
# the live heap, softly capped at 1 GiB (harness/servers.py FERRETDB_GC says why).
export GOGC=1600 GOMEMLIMIT=1GiB
mkdir -p "$dir"
exec .cache/ferretdb/bin/ferretdb --handler=sqlite --sqlite-url="file:$dir/" \
  --listen-addr=127.0.0.1:27017 --repl-set-name=rs0 --telemetry=disable --log-level=warn \
  --debug-addr=- --state-dir="$dir" --test-capped-cleanup-interval=200ms
