#!/usr/bin/env bash
# The private development MariaDB under supervisord: data in var/mysql,
# socket var/mysql/mysqld.sock, TCP 127.0.0.1:3307. Initialises on first run.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$PWD/var/mysql"
# Its own tmpdir: a starting mariadbd deletes every #sql* file in its tmpdir,
# which in a shared /tmp are another server's live temporary tables.
mkdir -p "$dir/tmp"
if [ ! -d "$dir/data/mysql" ]; then
  mariadb-install-db --no-defaults --datadir="$dir/data" --user=root \
    --auth-root-authentication-method=normal --skip-test-db --tmpdir="$dir/tmp" >"$dir/install.log" 2>&1
fi
exec mariadbd --no-defaults --datadir="$dir/data" --socket="$dir/mysqld.sock" --port=3307 \
  --tmpdir="$dir/tmp" --bind-address=127.0.0.1 --user=root --skip-log-bin --pid-file="$dir/mariadb.pid" \
  --innodb-buffer-pool-size=256M --max-connections=500
