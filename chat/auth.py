"""Who is speaking: user ids and the HS256 tokens that carry them.

The embedding app owns its users; we only trust a JWT signed with the shared
secret whose ``sub`` is a user id and whose ``exp`` is set; ``exp``, ``nbf``
and ``iat`` must be JSON numbers between 1970 and the year 9999.
"""

from __future__ import annotations

import re
import time
from functools import lru_cache
from typing import TypeGuard

import jwt
from jwt.types import Options

from chat.errors import ChatError

USER_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ALGORITHM = "HS256"
# Clients send the same token on every request for its whole life, and a
# full HS256 check (base64, two JSON parses, HMAC) was a fifth of the API's
# CPU per message. Each distinct token is checked once; a hit still checks
# `exp`, the one claim that turns a valid token invalid with time.
VERIFIED_CACHE_MAX = 16_384
# The latest NumericDate taken (9999-12-31T23:59:59Z). `exp`, `nbf` and `iat`
# are JSON numbers of seconds (RFC 7519, section 2): JSON integers have no
# bound (10**400 is one, and no float holds it), and no date a client means
# lies past this.
NUMERIC_DATE_MAX = 253_402_300_799
# PyJWT reads a time claim with int(): "9999999999" and true pass as numbers
# there. Its time checks are off and done here, after the types are.
DECODE_OPTIONS: Options = {
    "require": ["exp", "sub"], "verify_exp": False, "verify_nbf": False, "verify_iat": False,
}


class AuthError(ChatError):
    """The token is missing, malformed, forged, expired or names no valid user."""


def is_user_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and USER_ID.fullmatch(value) is not None


def mint(secret: str, user: str, ttl_seconds: int = 3600) -> str:
    if not is_user_id(user):
        raise ValueError(f"user id must be 1-64 chars of [A-Za-z0-9_.-], got {user!r}")
    now = int(time.time())
    return jwt.encode({"sub": user, "iat": now, "exp": now + ttl_seconds}, secret, algorithm=ALGORITHM)


def verify(secret: str, token: str | None) -> str:
    """Returns the user id the token speaks for, or raises AuthError."""
    return verify_until(secret, token)[0]


def verify_until(secret: str, token: str | None) -> tuple[str, float]:
    """The user id the token speaks for and its ``exp`` (Unix time), or raises AuthError."""
    if not token:
        raise AuthError("missing token")
    user, expires = _verified(secret, token)
    if expires <= time.time():
        raise AuthError("token expired")
    return user, expires


@lru_cache(maxsize=VERIFIED_CACHE_MAX)
def _verified(secret: str, token: str) -> tuple[str, float]:
    """(user, exp) of a token whose signature and claims check out; raises
    otherwise (and an exception is never cached: a bad token is checked anew)."""
    try:
        # Pinning algorithms rejects `alg: none` and key-confusion tokens.
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], options=DECODE_OPTIONS)
    except jwt.PyJWTError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    user = claims["sub"]
    if not is_user_id(user):
        raise AuthError("token sub is not a valid user id")
    exp, nbf, iat = numeric_date(claims, "exp"), numeric_date(claims, "nbf"), numeric_date(claims, "iat")
    now = time.time()
    if exp is None or exp <= now:  # (None: never, `require` has it)
        raise AuthError("token expired")
    # As PyJWT checks them, with no leeway: a token issued "later" is not valid yet either.
    for name, value in (("nbf", nbf), ("iat", iat)):
        if value is not None and value > now:
            raise AuthError(f"invalid token: not yet valid ({name})")
    return user, exp


def numeric_date(claims: dict[str, object], name: str) -> float | None:
    """The claim ``name`` as Unix time, None if absent; AuthError unless it is
    a JSON number (not a string, not a boolean) from 0 to ``NUMERIC_DATE_MAX``."""
    if name not in claims:
        return None
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AuthError(f"invalid token: {name} is not a number")
    # Compared before any conversion (float() of a huge int overflows); NaN compares false.
    if not 0 <= value <= NUMERIC_DATE_MAX:
        raise AuthError(f"invalid token: {name} out of range")
    return float(value)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
