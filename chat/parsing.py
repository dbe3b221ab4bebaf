"""Checks on text from requests, shared by the API and the daemons. Pure."""


def is_decimal(raw: str, digits: int) -> bool:
    """A plain ASCII decimal of at most ``digits`` digits, which int() takes.

    str.isdigit() alone also takes "²" and other digits that int() refuses,
    and int() refuses over 4,300 digits: either would be a 500, not a 4xx.
    """
    return raw.isascii() and raw.isdigit() and len(raw) <= digits
