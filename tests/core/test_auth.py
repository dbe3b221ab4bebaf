import time

import jwt
import orjson
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
], ids=["none", "empty", "garbage", "other-secret", "expired", "alg-none", "no-exp", "no-sub", "bad-sub", "hs512"])
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


def signed(payload: str) -> str:
    """An HS256 token over this exact JSON text: numbers no encoder writes
    from a Python value (1e400, NaN) included."""
    return jwt.api_jws.encode(payload.encode(), SECRET, algorithm="HS256")


GOOD = {"sub": '"alice"', "exp": "{soon}"}


# (claim, its JSON text, whether the token is accepted); the other claims are
# GOOD's. {soon} is an hour from now, {ago} a minute ago (the ids stay the same).
CLAIMS = [
    ("exp", "{soon}", True),
    ("exp", "{soon}.5", True),  # a NumericDate may have a fraction
    ("exp", str(auth.NUMERIC_DATE_MAX), True),  # the year 9999's last second
    ("exp", str(auth.NUMERIC_DATE_MAX + 1), False),
    ("exp", str(10**400), False),  # a JSON integer no float holds
    ("exp", "1e400", False),  # read as infinity
    ("exp", "1e300", False),
    ("exp", "Infinity", False), ("exp", "-Infinity", False), ("exp", "NaN", False),
    ("exp", "-1", False), ("exp", "0", False), ("exp", "{ago}", False),
    ("exp", '"{soon}"', False), ("exp", '"9999999999"', False),  # a numeric string is no NumericDate
    ("exp", "true", False), ("exp", "false", False), ("exp", "null", False),
    ("exp", "[{soon}]", False), ("exp", '{"n": {soon}}', False),
    ("nbf", "{ago}", True), ("nbf", "0", True), ("nbf", "{ago}.25", True),
    ("nbf", "{soon}", False),  # not valid yet
    ("nbf", str(10**400), False), ("nbf", "-1", False), ("nbf", "1e400", False), ("nbf", "NaN", False),
    ("nbf", '"0"', False), ("nbf", "true", False), ("nbf", "false", False), ("nbf", "null", False),
    ("nbf", "[0]", False),
    ("iat", "{ago}", True), ("iat", "0", True),
    ("iat", "{soon}", False),  # issued in the future
    ("iat", str(10**400), False), ("iat", "-1", False), ("iat", "-Infinity", False), ("iat", "NaN", False),
    ("iat", '"0"', False), ("iat", "false", False), ("iat", "true", False), ("iat", "null", False),
    ("iat", "{}", False),
    ("sub", '"' + "a" * 64 + '"', True), ("sub", '"A.b-c_9"', True),
    ("sub", '"' + "a" * 65 + '"', False), ("sub", '""', False), ("sub", "42", False), ("sub", "null", False),
    ("sub", '["alice"]', False), ("sub", '{"$ne": ""}', False), ("sub", '"alice\\n"', False),
    ("sub", '"al ice"', False), ("sub", "true", False),
]


@pytest.mark.parametrize(("claim", "text", "accepted"), CLAIMS,
                         ids=[f"{c}={t if len(t) <= 24 else f'{t[:4]}...({len(t)} chars)'}" for c, t, _ in CLAIMS])
def test_time_claims_are_numbers_in_range_and_sub_a_user_id(claim, text, accepted):
    now = int(time.time())
    claims = {name: value.replace("{soon}", str(now + 3600)).replace("{ago}", str(now - 60))
              for name, value in {**GOOD, claim: text}.items()}
    token = signed("{" + ", ".join(f'"{name}": {value}' for name, value in claims.items()) + "}")
    if accepted:
        assert auth.verify_until(SECRET, token)[0] == orjson.loads(claims["sub"])
    else:
        with pytest.raises(auth.AuthError):
            auth.verify_until(SECRET, token)


def test_a_refused_claim_is_refused_again_not_cached():
    token = signed(f'{{"sub": "alice", "exp": {10**400}}}')
    for _ in range(2):
        with pytest.raises(auth.AuthError, match="exp out of range"):
            auth.verify(SECRET, token)
