"""Credentials left in log files: every JWT-shaped string (three base64url
parts, the first two JSON objects, so starting ``eyJ``) in every file under a
folder. A cluster run scans all of its logs, nginx's included: no log we write
or configure may hold a token a reader could replay."""

from __future__ import annotations

import re
from pathlib import Path

JWT = re.compile(rb"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}")


def tokens_in(text: bytes) -> int:
    return len(JWT.findall(text))


def tokens_in_logs(folder: Path) -> dict[str, int]:
    """Per file (relative to ``folder``) with any, how many JWTs it holds."""
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()):
        if path.name == "secret" or path.stat().st_size > 2**31:
            continue
        if count := tokens_in(path.read_bytes()):
            found[str(path.relative_to(folder))] = count
    return found
