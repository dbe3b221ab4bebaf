"""The push side's frames held to the AsyncAPI document (api/asyncapi.py): the stream's, and the signals.

`violations(frame)` says how a frame a test received differs from the
document's schema for its type; the end-to-end tests run every WebSocket frame
and every long-poll answer they get through it (tests/e2e/conftest.py)."""

from __future__ import annotations

import functools

from jsonschema import Draft7Validator, FormatChecker, ValidationError

from api.asyncapi import schemas
from chat.settings import Settings

# Each frame a daemon sends, by `type`: the schema that describes it. A presence frame has two
# shapes, each its own schema: a snapshot (`users`) and a change (`user`).
FRAME_SCHEMA = {"hello": "Hello", "message": "Message", "edit": "Edit", "delete": "Delete", "read": "Read",
                "delivered": "Delivered", "error": "ErrorFrame", "typing": "Typing", "presence": "PresenceChange"}
PRESENCE_SNAPSHOT = "PresenceSnapshot"
# The frames of the stream, which a poll answer's `messages` holds.
STREAM_FRAMES = ("message", "edit", "delete", "read", "delivered")


@functools.cache
def _validators() -> dict[str, Draft7Validator]:
    return {name: Draft7Validator(schema, format_checker=FormatChecker())
            for name, schema in schemas(Settings()).items()}


def _kind(frame: object, kinds: tuple[str, ...] = tuple(FRAME_SCHEMA)) -> str | None:
    """The schema of ``frame``'s ``type``, or None when it has none of ``kinds``."""
    kind = frame.get("type") if isinstance(frame, dict) else None
    if kind == "presence" and kind in kinds and "users" in frame:
        return PRESENCE_SNAPSHOT
    return FRAME_SCHEMA[kind] if kind in kinds else None


def _described(schema: str, error: ValidationError, within: tuple = ()) -> list[str]:
    """``error`` as a line naming the schema and the path; a frame of a poll answer's ``messages``
    (one of several schemas) is judged by its own type's, so that the line says what differs."""
    path = (*within, *error.relative_path)
    where = f"{schema} at /{'/'.join(map(str, path))}"
    if error.validator == "oneOf" and not within and len(path) == 2:
        name = _kind(error.instance, STREAM_FRAMES)
        if name is None:
            return [f"{where}: not a frame of the stream: {error.instance!r:.200}"]
        return [line for inner in _validators()[name].iter_errors(error.instance)
                for line in _described(name, inner, path)]
    return [f"{where}: {error.message:.200}"]


def violations(frame: object, schema: str | None = None) -> list[str]:
    """What is wrong with ``frame`` (a decoded JSON frame) as the document has it;
    [] when nothing. ``schema``: the schema's name; by default the one of the
    frame's ``type`` (a frame of no known type is itself a violation)."""
    if schema is None:
        schema = _kind(frame)
        if schema is None:
            return [f"a frame of no documented type: {frame!r:.200}"]
    return [line for error in _validators()[schema].iter_errors(frame) for line in _described(schema, error)]
