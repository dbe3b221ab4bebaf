"""Checks on text from requests, shared by the API and the daemons. Pure."""

import re


def is_decimal(raw: str, digits: int) -> bool:
    """A plain ASCII decimal of at most ``digits`` digits, which int() takes.

    str.isdigit() alone also takes "²" and other digits that int() refuses,
    and int() refuses over 4,300 digits: either would be a 500, not a 4xx.
    """
    return raw.isascii() and raw.isdigit() and len(raw) <= digits


# A device id a client picks (its acks, its push registration): a user id's alphabet and
# length, but not "." or "..", which URL paths (DELETE /v1/devices/{device}) cannot carry.
DEVICE_ID = re.compile(r"(?!\.\.?$)[A-Za-z0-9_.-]{1,64}")


def is_device_id(value: object) -> bool:
    return isinstance(value, str) and DEVICE_ID.fullmatch(value) is not None
