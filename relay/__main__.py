"""``python -m relay``: the host's oplog relay, on ``CHAT_OPLOG_RELAY_SOCKET``."""

import uvloop

from chat.logs import setup_logging
from chat.settings import Settings
from relay.server import run

if __name__ == "__main__":
    settings = Settings()
    setup_logging(settings.log_level)
    if not settings.relay.socket:
        raise SystemExit("relay: set CHAT_OPLOG_RELAY_SOCKET (the daemons connect there)")
    uvloop.run(run(settings))
