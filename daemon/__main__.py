"""``python -m daemon``: one delivery daemon on the shared port."""

import uvloop

from chat.auth_config import require_safe_auth
from chat.logs import setup_logging
from chat.settings import Settings
from daemon.lifecycle import run

if __name__ == "__main__":
    settings = Settings()
    setup_logging(settings.log_level)
    require_safe_auth(settings, "daemon")
    uvloop.run(run(settings))
