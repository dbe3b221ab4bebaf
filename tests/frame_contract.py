"""The push side's frames held to the AsyncAPI document (api/asyncapi.py).

`violations(frame)` says how a frame a test received differs from the
document's schema for its type; the end-to-end tests run every WebSocket frame
and every long-poll answer they get through it (tests/e2e/conftest.py)."""

from __future__ import annotations

import functools

from jsonschema import Draft7Validator, FormatChecker

from api.asyncapi import schemas
from chat.settings import Settings

FRAME_SCHEMA = {"hello": "Hello", "message": "Message"}


@functools.cache
def _validators() -> dict[str, Draft7Validator]:
    return {name: Draft7Validator(schema, format_checker=FormatChecker())
            for name, schema in schemas(Settings()).items()}


def violations(frame: object, schema: str | None = None) -> list[str]:
    """What is wrong with ``frame`` (a decoded JSON frame) as the document has it;
    [] when nothing. ``schema``: the schema's name; by default the one of the
    frame's ``type`` (a frame of no known type is itself a violation)."""
    if schema is None:
        kind = frame.get("type") if isinstance(frame, dict) else None
        if kind not in FRAME_SCHEMA:
            return [f"a frame of no documented type: {frame!r:.200}"]
        schema = FRAME_SCHEMA[kind]
    return [f"{schema} at /{'/'.join(map(str, e.absolute_path))}: {e.message:.200}"
            for e in _validators()[schema].iter_errors(frame)]
