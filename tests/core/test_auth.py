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


def test_user_ids():
    assert auth.is_user_id("a") and auth.is_user_id("A.b-c_9" * 9)
    assert not auth.is_user_id("") and not auth.is_user_id("x" * 65)
    assert not auth.is_user_id("a b") and not auth.is_user_id({"$ne": ""})


def test_bearer():
    assert auth.bearer("Bearer abc") == "abc"
    assert auth.bearer("bearer abc") == "abc"
    assert auth.bearer("Basic abc") is None
    assert auth.bearer(None) is None
