"""``python -m writer``: the host's writer process, on ``CHAT_WRITER_SOCKET``."""

import uvloop

from chat.logs import setup_logging
from chat.settings import Settings
from writer.server import run

if __name__ == "__main__":
    settings = Settings()
    setup_logging(settings.log_level)
    if not settings.writer.socket:
        raise SystemExit("writer: set CHAT_WRITER_SOCKET (the API processes connect there)")
    uvloop.run(run(settings))
