"""``python -m api``: one write-API process on the shared port."""

from api.app import create_app
from chat.auth_config import require_safe_auth
from chat.logs import setup_logging
from chat.serve import serve
from chat.settings import Settings

if __name__ == "__main__":
    settings = Settings()
    setup_logging(settings.log_level)
    require_safe_auth(settings, "api", serves_dev_login=True)
    serve(create_app(settings), settings.api.host, settings.api.port, settings.api.head_timeout_seconds,
          settings.api.http_idle_seconds, limit_concurrency=settings.api.max_connections, timeout_keep_alive=75)
