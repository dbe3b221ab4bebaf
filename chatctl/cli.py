"""``chatctl``: tokens for development and tests, and a small client.

    chatctl token alice --ttl 1h
    chatctl send --as alice bob "hello"
    chatctl listen --as bob [--since CURSOR]
    chatctl partitions show
    chatctl partitions grow 8    (writers stopped: docs/operations.md)
"""

from __future__ import annotations

import asyncio
import re
import sys

import httpx
import orjson
import typer

from chat import auth
from chat.auth_config import require_safe_auth
from chat.settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
partitions_app = typer.Typer(add_completion=False, no_args_is_help=True,
                             help="The slot map of the partitions, in MySQL (docs/operations.md).")
app.add_typer(partitions_app, name="partitions")

_DURATION = re.compile(r"(\d+)([smhd]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def signing_settings() -> Settings:
    """The settings, if their secret may sign tokens (chat.auth_config); else exits with why."""
    settings = Settings()
    require_safe_auth(settings, "chatctl")
    return settings


def parse_ttl(text: str) -> int:
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise typer.BadParameter("use a number with an optional unit: 90s, 15m, 1h, 7d")
    return int(match.group(1)) * _UNIT[match.group(2)]


@app.command()
def token(user: str, ttl: str = typer.Option("1h", help="Lifetime: 90s, 15m, 1h, 7d")) -> None:
    """Print a JWT (HS256, signed with CHAT_JWT_SECRET) whose sub is USER."""
    settings = signing_settings()
    try:
        typer.echo(auth.mint(settings.jwt_secret.get_secret_value(), user, parse_ttl(ttl)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="USER") from None


@app.command()
def send(to: str, body: str, sender: str = typer.Option(..., "--as", help="Send as this user"),
         client_msg_id: str = typer.Option(None, help="Idempotency key; a retry with it stores nothing new"),
         api: str = typer.Option(None, help="API base URL (default from settings)")) -> None:
    """POST one message and print the stored message as JSON."""
    settings = signing_settings()
    base = api or f"http://{settings.api_host}:{settings.api_port}"
    tok = auth.mint(settings.jwt_secret.get_secret_value(), sender, 300)
    payload = {"to": to, "body": body}
    if client_msg_id:
        payload["client_msg_id"] = client_msg_id
    reply = httpx.post(f"{base}/v1/messages", json=payload, headers={"Authorization": f"Bearer {tok}"}, timeout=10)
    typer.echo(reply.text)
    if reply.status_code >= 300:
        raise typer.Exit(1)


@app.command()
def listen(user: str = typer.Option(..., "--as", help="Listen as this user"),
           since: str = typer.Option(None, help="Resume after this message id or cursor"),
           url: str = typer.Option(None, help="Daemon base URL, ws://host:port (default from settings)"),
           count: int = typer.Option(0, help="Stop after this many messages (0: never)"),
           token_ttl: str = typer.Option("1d", help="Lifetime of each token it mints: 90s, 15m, 1h, 7d")) -> None:
    """Print incoming messages as JSON lines; reconnects and resumes with the last cursor, follows a 421 to
    the user's partition, and mints a new token when the daemon closes with 4001 (token expired) or
    refuses one with 401 (it expired while away), saying so on stderr."""
    from chatctl.client import Inbox, listen as run_listen

    settings = signing_settings()
    base = url or f"ws://{settings.daemon_host}:{settings.daemon_port}"
    ttl = parse_ttl(token_ttl)
    inbox = Inbox(since)

    def mint() -> str:
        return auth.mint(settings.jwt_secret.get_secret_value(), user, ttl)

    def renew(why: str) -> str:
        typer.echo(f"chatctl listen: token {why}: minted a new one, resuming from {inbox.since}", err=True)
        return mint()

    def show(frame: dict) -> None:
        sys.stdout.write(orjson.dumps(frame).decode() + "\n")
        sys.stdout.flush()

    try:
        tok = mint()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--as") from None
    asyncio.run(run_listen(base, tok, since, show, count or None, inbox=inbox, renew=renew))


@partitions_app.command("show")
def partitions_show() -> None:
    """Print the map's epoch, its partitions, and each one's slots."""
    from chatctl import partitions
    from db.partition_map import NoSlotMap

    try:
        typer.echo(partitions.show(Settings()))
    except NoSlotMap as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


@partitions_app.command("grow")
def partitions_grow(count: int = typer.Argument(..., help="The number of partitions to grow to")) -> None:
    """Grow to COUNT partitions: new tables and collections, then the map (only the slots that change
    partition move; their users' cursors give recovered: false). Stop the writers first; restart every
    process after."""
    from chatctl import partitions
    from db.partition_map import NoSlotMap

    try:
        typer.echo(partitions.grow(Settings(), count))
    except (partitions.Refused, NoSlotMap) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


if __name__ == "__main__":
    app()
