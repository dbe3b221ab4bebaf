"""Structured log lines (key=value after the logger name). Tokens never reach them."""

from __future__ import annotations

import logging
import re
import sys

_TOKEN = re.compile(r"(token=|[Bb]earer\s+)[A-Za-z0-9._~+/=-]+")


class RedactTokens(logging.Filter):
    """uvicorn logs the request path with its query string (/v1/ws?token=...)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.msg = record.getMessage()
            record.args = None
        if isinstance(record.msg, str):
            record.msg = _TOKEN.sub(r"\1<redacted>", record.msg)
        return True


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "ts=%(asctime)s level=%(levelname)s logger=%(name)s pid=%(process)d %(message)s"))
    handler.addFilter(RedactTokens())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # One line per accepted WebSocket is noise at 100k connections.
    logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, logging.getLogger().level))
    logging.getLogger("uvicorn.access").disabled = True
