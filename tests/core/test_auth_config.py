"""Which token secrets and dev-login settings a process refuses to start with
(chat/auth_config.py), and which configs turn development mode on."""

from __future__ import annotations

import configparser
import secrets
from pathlib import Path

import pytest

from chat.auth_config import NEW_SECRET_COMMAND, auth_problems, dev_login_problem, require_safe_auth, secret_problem
from chat.settings import DEV_JWT_SECRET, AuthSettings, Settings

ROOT = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = ROOT / "deploy" / "chat-delivery.env.example"


def settings(**auth) -> Settings:
    return Settings(_env_file=None, auth=AuthSettings(**auth))


@pytest.mark.parametrize("secret, says", [
    (DEV_JWT_SECRET, "CHAT_JWT_SECRET is not set: the built-in default is public"),
    ("change-me", "CHAT_JWT_SECRET is a placeholder"),
    ("CHANGE_ME-" + "0123456789" * 4, "CHAT_JWT_SECRET is a placeholder"),
    ("replace-me-with-a-long-random-value-please", "CHAT_JWT_SECRET is a placeholder"),
    ("a" * 31, "CHAT_JWT_SECRET is 31 bytes long, shorter than 32"),
    ("é" * 15, "CHAT_JWT_SECRET is 30 bytes long, shorter than 32"),  # bytes, not characters
    ("", "CHAT_JWT_SECRET is 0 bytes long, shorter than 32"),
])
def test_a_public_placeholder_or_short_secret_is_refused_with_how_to_fix_it(secret, says):
    problem = secret_problem(secret, dev_mode=False)
    assert problem is not None and problem.startswith(says)
    assert NEW_SECRET_COMMAND in problem and "CHAT_DEV_MODE=true" in problem


@pytest.mark.parametrize("secret", [secrets.token_urlsafe(48), secrets.token_hex(32), "x7" * 16,
                                    "test-secret-0123456789abcdef0123456789"],
                         ids=["token_urlsafe", "token_hex", "repeated", "test-secret"])
def test_a_long_secret_of_no_known_kind_is_accepted(secret):
    assert secret_problem(secret, dev_mode=False) is None


@pytest.mark.parametrize("secret", [DEV_JWT_SECRET, "change-me", "short"])
def test_development_mode_accepts_any_secret(secret):
    assert secret_problem(secret, dev_mode=True) is None


def test_dev_login_needs_development_mode():
    assert "CHAT_DEV_LOGIN=true" in dev_login_problem(dev_login=True, dev_mode=False)
    assert dev_login_problem(dev_login=True, dev_mode=True) is None
    assert dev_login_problem(dev_login=False, dev_mode=False) is None


def test_defaults_are_refused_and_only_the_api_checks_dev_login():
    assert auth_problems(settings()) == [secret_problem(DEV_JWT_SECRET, False)]
    strong = settings(jwt_secret=secrets.token_urlsafe(48), dev_login=True)
    assert auth_problems(strong) == []  # a daemon serves no dev login
    assert auth_problems(strong, serves_dev_login=True) == [dev_login_problem(True, False)]
    both = auth_problems(settings(dev_login=True), serves_dev_login=True)
    assert len(both) == 2


def test_require_safe_auth_exits_naming_the_process():
    with pytest.raises(SystemExit) as refused:
        require_safe_auth(settings(jwt_secret="change-me"), "daemon")
    assert str(refused.value).startswith("daemon: refusing to start: CHAT_JWT_SECRET is a placeholder")
    require_safe_auth(settings(dev_mode=True, dev_login=True), "api", serves_dev_login=True)  # no exit


def test_the_production_template_secret_is_refused():
    values = dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
                  if line.strip() and not line.startswith("#"))
    assert "CHAT_DEV_MODE" not in values
    assert secret_problem(values["CHAT_JWT_SECRET"], dev_mode=False) is not None


def test_make_run_is_in_development_mode_and_production_is_not():
    dev = configparser.ConfigParser(interpolation=None)
    dev.read(ROOT / "supervisord.conf")
    assert 'CHAT_DEV_MODE="true"' in dev["supervisord"]["environment"].split(",")  # every program inherits it
    for prod in ("deploy/supervisord.prod.conf", "deploy/compose.yaml", "deploy/Dockerfile",
                 "deploy/systemd/chat-delivery.service"):
        assert "CHAT_DEV_MODE" not in (ROOT / prod).read_text(), prod
