"""``python -m pusher``: offline push to registered devices through a Matrix Push Gateway (docs/push.md)."""

import uvloop

from chat.logs import setup_logging
from chat.settings import Settings
from pusher.process import run

if __name__ == "__main__":
    settings = Settings()
    setup_logging(settings.log_level)
    uvloop.run(run(settings))
