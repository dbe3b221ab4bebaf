"""Refuses auth settings that would let anyone mint tokens.

Whoever knows ``CHAT_JWT_SECRET`` can sign a token for any user. The default
is in this repository and the deploy template's placeholder is public, and a
short key can be guessed offline from one token: a process that signs or
verifies tokens (the API, the daemons, ``chatctl``) refuses to start with
one, unless ``CHAT_DEV_MODE`` says this is a development machine.
``CHAT_DEV_LOGIN`` (log in as anyone) likewise needs development mode.
"""

from __future__ import annotations

from chat.settings import DEV_JWT_SECRET, Settings

SECRET_MIN_BYTES = 32  # HS256's key is a 256-bit HMAC key (RFC 7518 section 3.2)
# Words that mark a value as "fill me in", in any case, with or without a
# separator: `change-me` in deploy/chat-delivery.env.example, and their kin.
PLACEHOLDER_WORDS = ("changeme", "change-me", "change_me", "replaceme", "replace-me", "replace_me",
                     "your-secret", "your_secret", "yoursecret")
NEW_SECRET_COMMAND = 'python -c "import secrets; print(secrets.token_urlsafe(48))"'


def secret_problem(secret: str, dev_mode: bool) -> str | None:
    """What is wrong with ``secret`` as the token key, and how to fix it; None if nothing is."""
    if dev_mode:
        return None
    if secret == DEV_JWT_SECRET:
        problem = "CHAT_JWT_SECRET is not set: the built-in default is public"
    elif any(word in secret.lower() for word in PLACEHOLDER_WORDS):
        problem = "CHAT_JWT_SECRET is a placeholder"
    elif len(secret.encode()) < SECRET_MIN_BYTES:
        problem = f"CHAT_JWT_SECRET is {len(secret.encode())} bytes long, shorter than {SECRET_MIN_BYTES}"
    else:
        return None
    return (f"{problem}, so anyone could sign tokens for any user. Set CHAT_JWT_SECRET to a random value of "
            f"{SECRET_MIN_BYTES} bytes or more, the same on every host, e.g. the output of `{NEW_SECRET_COMMAND}`; "
            "on a development machine set CHAT_DEV_MODE=true instead.")


def dev_login_problem(dev_login: bool, dev_mode: bool) -> str | None:
    """Why ``CHAT_DEV_LOGIN`` may not be on; None if it may."""
    if dev_login and not dev_mode:
        return ("CHAT_DEV_LOGIN=true lets anyone log in as any user, and is for development machines only: "
                "unset it, or set CHAT_DEV_MODE=true on a development machine.")
    return None


def auth_problems(settings: Settings, serves_dev_login: bool = False) -> list[str]:
    """Every reason a process that handles tokens (and, with ``serves_dev_login``,
    serves ``POST /v1/dev/token``) must not start with these settings."""
    problems = [secret_problem(settings.auth.jwt_secret.get_secret_value(), settings.auth.dev_mode)]
    if serves_dev_login:
        problems.append(dev_login_problem(settings.auth.dev_login, settings.auth.dev_mode))
    return [p for p in problems if p is not None]


def require_safe_auth(settings: Settings, process: str, serves_dev_login: bool = False) -> None:
    """At an entry point: exits with status 1 and the reasons if ``auth_problems`` finds any."""
    problems = auth_problems(settings, serves_dev_login)
    if problems:
        raise SystemExit("\n".join(f"{process}: refusing to start: {p}" for p in problems))
