#!/usr/bin/env bash
# `make run`: install what is missing, then run everything under supervisord
# in the foreground. Ctrl-C stops it all; the data in var/ is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
mkdir -p var/log var/mysql var/ferretdb
if [ -S var/supervisor.sock ] && .venv/bin/supervisorctl status >/dev/null 2>&1; then
  echo "run: supervisord is already running here (.venv/bin/supervisorctl status)"; exit 1
fi
exec .venv/bin/supervisord -n -c supervisord.conf
