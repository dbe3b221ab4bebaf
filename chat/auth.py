"""Who is speaking: user ids and the HS256 tokens that carry them.

The embedding app owns its users; we only trust a JWT signed with the shared
secret whose ``sub`` is a user id and whose ``exp`` is set.
"""

from __future__ import annotations

import re
import time
from functools import lru_cache
from typing import TypeGuard

import jwt

from chat.errors import ChatError

USER_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ALGORITHM = "HS256"
# Clients send the same token on every request for its whole life, and a
# full HS256 check (base64, two JSON parses, HMAC) was a fifth of the API's
# CPU per message. Each distinct token is checked once; a hit still checks
# `exp`, the one claim that turns a valid token invalid with time.
VERIFIED_CACHE_MAX = 16_384


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
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], options={"require": ["exp", "sub"]})
    except jwt.ExpiredSignatureError:
        raise AuthError("token expired") from None
    except jwt.PyJWTError as exc:
        raise AuthError(f"invalid token: {exc}") from None
    user = claims["sub"]
    if not is_user_id(user):
        raise AuthError("token sub is not a valid user id")
    return user, float(claims["exp"])


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None
