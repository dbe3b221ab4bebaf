"""``python -m daemon``: one delivery daemon on the shared port."""

from chat.logs import setup_logging
from chat.serve import serve
from chat.settings import Settings
from daemon.server import create_app, start_draining

if __name__ == "__main__":
    settings = Settings()
    setup_logging(settings.log_level)
    app = create_app(settings)
    serve(app, settings.daemon_host, settings.daemon_port, on_exit=lambda: start_draining(app),
          ws="websockets-sansio", ws_max_size=settings.ws_max_frame_bytes,
          ws_ping_interval=settings.ping_interval_seconds, ws_ping_timeout=settings.ping_timeout_seconds,
          ws_per_message_deflate=False, timeout_graceful_shutdown=settings.drain_seconds,
          timeout_keep_alive=75)
