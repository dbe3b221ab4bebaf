"""Who may connect to a daemon, decided without I/O (daemon/admission.py):
the status, JSON body and headers a refused client is sent."""

import time

import pytest

from chat import auth
from chat.errors import Refused
from chat.settings import DaemonSettings, Settings
from daemon.admission import admit, cors_headers, poll_limit, poll_timeout

SETTINGS = Settings(_env_file=None, daemon=DaemonSettings(allowed_origins=["https://chat.example"], max_connections=10))
SECRET = SETTINGS.auth.jwt_secret.get_secret_value()


def answer(refused: Refused) -> tuple[int, bytes, dict[str, str]]:
    return refused.status, refused.body(), refused.headers


def test_a_valid_token_from_an_allowed_origin_is_admitted_with_its_expiry():
    token = auth.mint(SECRET, "alice", 60)
    user, expires = admit(SETTINGS, token, "https://chat.example", open_connections=1, accepting=True)
    assert user == "alice" and time.time() < expires <= time.time() + 61
    assert admit(SETTINGS, token, None, open_connections=10, accepting=True)[0] == "alice"  # no Origin: not a page


def test_a_missing_token_gets_401_and_bearer():
    with pytest.raises(Refused) as refused:
        admit(SETTINGS, None, None, open_connections=1, accepting=True)
    status, body, headers = answer(refused.value)
    assert (status, headers) == (401, {"WWW-Authenticate": "Bearer"})
    assert body.startswith(b'{"error":"unauthorized","message":"')


def test_an_origin_not_allowed_gets_403():
    with pytest.raises(Refused) as refused:
        admit(SETTINGS, auth.mint(SECRET, "alice", 60), "https://evil.example", open_connections=1, accepting=True)
    assert answer(refused.value) == (
        403, b'{"error":"origin_not_allowed","message":"origin \'https://evil.example\' is not allowed"}', {})


@pytest.mark.parametrize(("open_connections", "accepting"), [(11, True), (1, False)], ids=["full", "draining"])
def test_a_full_starting_or_draining_daemon_answers_503_retry_after(open_connections, accepting):
    with pytest.raises(Refused) as refused:
        admit(SETTINGS, auth.mint(SECRET, "alice", 60), None, open_connections=open_connections,
              accepting=accepting)
    assert answer(refused.value) == (
        503, b'{"error":"try_again_later","message":"this daemon is full, starting or restarting; retry"}',
        {"Retry-After": "1"})


def test_poll_parameters_out_of_range_name_their_field():
    with pytest.raises(Refused) as refused:
        poll_timeout("31", 30.0)
    assert answer(refused.value) == (
        422, b'{"error":"invalid_field","message":"`timeout` must be seconds from 0 to 30","field":"timeout"}', {})
    with pytest.raises(Refused) as refused:
        poll_limit("0", 100)
    assert refused.value.field == "limit"
    assert (poll_timeout("2.5", 30.0), poll_limit(None, 100), poll_limit("7", 100)) == (2.5, 100, 7)


def test_cors_headers_go_only_to_an_allowed_origin():
    assert cors_headers(SETTINGS, "https://chat.example") == {"Access-Control-Allow-Origin": "https://chat.example",
                                                              "Vary": "Origin"}
    assert cors_headers(SETTINGS, "https://evil.example") == {} and cors_headers(SETTINGS, None) == {}
