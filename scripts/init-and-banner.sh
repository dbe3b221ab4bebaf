#!/usr/bin/env bash
# Creates both schemas once the servers answer, then prints where everything
# listens and a copy-paste "try it".
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m db.init
cat <<BANNER

  chat-delivery is up (supervisord; Ctrl-C stops everything)
    web chat page    http://127.0.0.1:8000/app/   (dev login on: "log in as" any user)
    write API        http://127.0.0.1:8000   (2 processes; /healthz /readyz /metrics /openapi.json)
    writer           var/run/writer.sock   (1 process: the group commit of both API processes)
    relay            var/run/relay.sock    (1 process: the one oplog tail both daemons read)
    daemons          ws://127.0.0.1:8100/v1/ws and http://127.0.0.1:8100/v1/poll   (2 processes)
    MariaDB          var/mysql/mysqld.sock, 127.0.0.1:3307      FerretDB  127.0.0.1:27017
    logs             var/log/        ops: .venv/bin/supervisorctl status

  Try it in a browser: open http://127.0.0.1:8000/app/ in two windows (or two
  profiles), log in as alice in one and bob in the other, open the chat, type.

  Or in a second terminal in this folder:
    export CHAT_DEV_MODE=true   # chatctl signs with the development secret, as make run does
    BOB=\$(.venv/bin/chatctl token bob); ALICE=\$(.venv/bin/chatctl token alice)
    .venv/bin/python -m websockets "ws://127.0.0.1:8100/v1/ws?token=\$BOB" &
    curl -s -X POST http://127.0.0.1:8000/v1/messages -H "Authorization: Bearer \$ALICE" \\
         -H 'Content-Type: application/json' -d '{"to": "bob", "body": "hello bob"}'

BANNER
