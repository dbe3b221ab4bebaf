import time

import jwt
import pytest

from chat import auth

SECRET = "s" * 32


def test_round_trip():
    assert auth.verify(SECRET, auth.mint(SECRET, "alice")) == "alice"


@pytest.mark.parametrize("token", [
    None, "", "garbage",
    jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, "other" * 8, algorithm="HS256"),
    jwt.encode({"sub": "alice", "exp": int(time.time()) - 60}, SECRET, algorithm="HS256"),
    jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, None, algorithm="none"),
    jwt.encode({"sub": "alice"}, SECRET, algorithm="HS256"),  # no exp
    jwt.encode({"exp": int(time.time()) + 60}, SECRET, algorithm="HS256"),  # no sub
    jwt.encode({"sub": "bad user!", "exp": int(time.time()) + 60}, SECRET, algorithm="HS256"),
    jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, SECRET, algorithm="HS512"),
])
def test_rejected_tokens(token):
    with pytest.raises(auth.AuthError):
        auth.verify(SECRET, token)


def test_a_token_checked_once_still_expires(monkeypatch):
    token = auth.mint(SECRET, "alice", ttl_seconds=60)
    assert auth.verify(SECRET, token) == "alice"  # now cached as valid
    real = time.time
    monkeypatch.setattr(auth.time, "time", lambda: real() + 61)
    with pytest.raises(auth.AuthError, match="expired"):
        auth.verify(SECRET, token)


def test_the_cache_is_keyed_by_secret():
    token = auth.mint(SECRET, "alice")
    assert auth.verify(SECRET, token) == "alice"
    with pytest.raises(auth.AuthError):
        auth.verify("another-secret-" * 3, token)


def test_user_ids():
    assert auth.is_user_id("a") and auth.is_user_id("A.b-c_9" * 9)
    assert not auth.is_user_id("") and not auth.is_user_id("x" * 65)
    assert not auth.is_user_id("a b") and not auth.is_user_id({"$ne": ""})


def test_bearer():
    assert auth.bearer("Bearer abc") == "abc"
    assert auth.bearer("bearer abc") == "abc"
    assert auth.bearer("Basic abc") is None
    assert auth.bearer(None) is None


def test_the_verified_cache_is_bounded_and_an_evicted_token_is_checked_again():
    auth._verified.cache_clear()
    tokens = [auth.mint(SECRET, f"u{i}") for i in range(auth.VERIFIED_CACHE_MAX + 1)]
    for t in tokens:
        auth.verify(SECRET, t)
    info = auth._verified.cache_info()
    assert info.currsize == auth.VERIFIED_CACHE_MAX  # the first token was evicted, never more held
    assert auth.verify(SECRET, tokens[0]) == "u0"  # and is simply verified again
    assert auth._verified.cache_info().misses == info.misses + 1
