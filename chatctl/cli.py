"""``chatctl``: tokens for development and tests, and a small client.

    chatctl token alice --ttl 1h
    chatctl send --as alice bob "hello"
    chatctl listen --as bob [--since CURSOR] [--format text] [--watch alice,carol] [--api URL]
    chatctl typing --as alice bob [--stop]
    chatctl presence --as bob alice carol
    chatctl read --as bob alice 12        (bob has read alice's messages up to 12)
    chatctl edit --as alice 12 "hello!"
    chatctl delete --as alice 12
    chatctl ack --as bob 12 [--device phone-1]
    chatctl device register --as bob phone-1 --platform android --app-id chat.example --pushkey TOKEN
    chatctl device list --as bob
    chatctl device remove --as bob phone-1
    chatctl partitions show
    chatctl partitions grow 8    (writers stopped: docs/operations.md)
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable
from enum import StrEnum
from urllib.parse import quote

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
device_app = typer.Typer(add_completion=False, no_args_is_help=True,
                         help="The push devices a user has registered: the pusher notifies them of what they missed.")
app.add_typer(device_app, name="device")

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
        typer.echo(auth.mint(settings.auth.jwt_secret.get_secret_value(), user, parse_ttl(ttl)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="USER") from None


def call_api(command: str, sender: str, api: str | None, method: str, path: str, json: dict | None = None,
             params: dict[str, str] | None = None) -> None:
    """One request to the write API as ``sender`` (a token of five minutes), its answer printed as
    it came, the exit status 1 unless it is a success; an API that does not answer is said on stderr."""
    settings = signing_settings()
    base = api or f"http://{settings.api.host}:{settings.api.port}"
    try:
        tok = auth.mint(settings.auth.jwt_secret.get_secret_value(), sender, 300)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--as") from None
    try:
        reply = httpx.request(method, f"{base}{path}", json=json, params=params,
                              headers={"Authorization": f"Bearer {tok}"}, timeout=10)
    except httpx.HTTPError as exc:
        typer.echo(f"chatctl {command}: {method} {base}{path}: {exc or type(exc).__name__}", err=True)
        raise typer.Exit(1) from None
    if reply.text:  # (204: nothing)
        typer.echo(reply.text)
    if reply.status_code >= 300:
        raise typer.Exit(1)


_AS = "{} as this user"
_API = typer.Option(None, help="API base URL (default from settings)")


@app.command()
def send(to: str, body: str, sender: str = typer.Option(..., "--as", help=_AS.format("Send")),
         client_msg_id: str = typer.Option(None, help="Idempotency key; a retry with it stores nothing new"),
         api: str = _API) -> None:
    """POST one message and print the stored message as JSON."""
    payload = {"to": to, "body": body}
    if client_msg_id:
        payload["client_msg_id"] = client_msg_id
    call_api("send", sender, api, "POST", "/v1/messages", json=payload)


@app.command()
def read(peer: str, upto: str = typer.Argument(..., help="A message id of your stream: read up to and including it"),
         reader: str = typer.Option(..., "--as", help=_AS.format("Read")), api: str = _API) -> None:
    """Mark the conversation with PEER read up to message UPTO; print your marker and unread count as JSON.
    Both users' devices get a `read` event."""
    call_api("read", reader, api, "POST", "/v1/read", json={"peer": peer, "upto": upto})


@app.command()
def edit(message_id: str = typer.Argument(..., metavar="ID", help="The id of one of your messages"),
         body: str = typer.Argument(..., help="Its new body"),
         sender: str = typer.Option(..., "--as", help=_AS.format("Edit")),
         client_msg_id: str = typer.Option(None, help="Idempotency key; a retry with it stores nothing new"),
         api: str = _API) -> None:
    """Replace the body of your message ID; print the `edit` event as JSON."""
    payload = {"body": body}
    if client_msg_id:
        payload["client_msg_id"] = client_msg_id
    call_api("edit", sender, api, "PATCH", f"/v1/messages/{quote(message_id, safe='')}", json=payload)


@app.command()
def delete(message_id: str = typer.Argument(..., metavar="ID", help="The id of one of your messages"),
           sender: str = typer.Option(..., "--as", help=_AS.format("Delete")),
           client_msg_id: str = typer.Option(None, help="Idempotency key; a retry with it stores nothing new"),
           api: str = _API) -> None:
    """Delete your message ID; print the `delete` event as JSON."""
    params = {"client_msg_id": client_msg_id} if client_msg_id else {}
    call_api("delete", sender, api, "DELETE", f"/v1/messages/{quote(message_id, safe='')}", params=params)


@app.command()
def ack(upto: str = typer.Argument(..., help="A position of your stream: everything up to it was received"),
        user: str = typer.Option(..., "--as", help=_AS.format("Acknowledge")),
        device: str = typer.Option(None, help="The device that received it (default: the API's, `default`)"),
        api: str = _API) -> None:
    """Acknowledge that a device received your stream up to UPTO; print its position as JSON. The senders
    of what it covers get a `delivered` event."""
    payload = {"upto": upto}
    if device is not None:
        payload["device"] = device
    call_api("ack", user, api, "POST", "/v1/acks", json=payload)


def path_segment(value: str) -> str:
    """``value`` as one segment of a URL path: `/` encoded, and `.` and `..` too, which an HTTP client would
    otherwise take for the current and the parent directory."""
    return quote(value, safe="") if value not in (".", "..") else value.replace(".", "%2E")


_DEVICE = typer.Argument(..., metavar="DEVICE", help="Your name for the device: 1-64 characters of [A-Za-z0-9_.-]")


def parse_data(text: str | None) -> object:
    """``--data``: a JSON document (the API says whether it is an object small enough)."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--data") from None


@device_app.command("register")
def device_register(device: str = _DEVICE,
                    platform: str = typer.Option(..., help="ios, android or web"),
                    app_id: str = typer.Option(..., help="The app id the push gateway knows"),
                    pushkey: str = typer.Option(..., help="The device's push token (or Web Push endpoint)"),
                    data: str = typer.Option(None, help="A JSON object the push gateway gets with each "
                                                        "notification, e.g. '{\"url\": \"https://...\"}'"),
                    user: str = typer.Option(..., "--as", help=_AS.format("Register")), api: str = _API) -> None:
    """Register DEVICE for offline push, or replace its registration; print it as JSON."""
    payload: dict[str, object] = {"device": device, "platform": platform, "app_id": app_id, "pushkey": pushkey}
    if data is not None:
        payload["data"] = parse_data(data)
    call_api("device register", user, api, "POST", "/v1/devices", json=payload)


@device_app.command("list")
def device_list(user: str = typer.Option(..., "--as", help=_AS.format("List")), api: str = _API) -> None:
    """Print your registered push devices as JSON, oldest first."""
    call_api("device list", user, api, "GET", "/v1/devices")


@device_app.command("remove")
def device_remove(device: str = _DEVICE, user: str = typer.Option(..., "--as", help=_AS.format("Remove")),
                  api: str = _API) -> None:
    """Remove your push device DEVICE: it is notified no more. Prints nothing."""
    call_api("device remove", user, api, "DELETE", f"/v1/devices/{path_segment(device)}")


@app.command()
def typing(peer: str = typer.Argument(..., help="Whom you are typing to"),
           stop: bool = typer.Option(False, "--stop", help="Say you stopped typing"),
           user: str = typer.Option(..., "--as", help=_AS.format("Type")), api: str = _API) -> None:
    """Tell PEER you are typing (or, with --stop, that you stopped): their devices and your others show it
    for the server's ttl unless it is said again (docs/presence.md). Prints the answer as JSON:
    `{"sent": false}` for a start within a second of the last one, which is dropped."""
    call_api("typing", user, api, "POST", "/v1/typing", json={"to": peer, "state": "stop" if stop else "start"})


@app.command()
def presence(users: list[str] = typer.Argument(..., metavar="USERS...",
                                               help="The users to ask about (at most 200), by spaces or commas"),
             viewer: str = typer.Option(..., "--as", help=_AS.format("Ask")), api: str = _API) -> None:
    """Print whether each of USERS is online, and when those who are not were last seen, as JSON. A hidden
    user reads as offline and never seen."""
    names = [name for arg in users for name in arg.split(",") if name]
    call_api("presence", viewer, api, "GET", "/v1/presence", params={"users": ",".join(names)})


class Format(StrEnum):
    json = "json"
    text = "text"


@app.command()
def listen(user: str = typer.Option(..., "--as", help="Listen as this user"),
           since: str = typer.Option(None, help="Resume after this message id or cursor"),
           url: str = typer.Option(None, help="Daemon base URL, ws://host:port (default from settings)"),
           count: int = typer.Option(0, help="Stop after this many messages and events (0: never)"),
           token_ttl: str = typer.Option("1d", help="Lifetime of each token it mints: 90s, 15m, 1h, 7d"),
           output: Format = typer.Option(Format.json, "--format",
                                         help="json: each frame as it came; text: a line a person reads, and "
                                              "the unread count on each connection"),
           watch: str = typer.Option(None, help="Users whose presence to follow, by commas: alice,carol"),
           api: str = typer.Option(None, help="API base URL, asked for the user's partition after a 421 or a 1012 "
                                              "(default from settings)")) -> None:
    """Print incoming messages and events (edits, deletes, read markers, delivery receipts), typing, and the
    presence of the users it watches, as JSON lines, or as text; reconnects and resumes with the last
    cursor, and mints a new token when the daemon closes with 4001 (token expired) or refuses one with 401
    (it expired while away). Refused with 421, or closed with 1012 (after the backoff), it asks the API
    for the user's partition and reconnects there (or where the 421 says when the API cannot tell), so
    that it follows the user's slot when it moves. Renewals and new routes are said on stderr. `--count`
    counts messages and events only."""
    from chatctl import render
    from chatctl.client import Inbox, listen as run_listen, partition_from_api

    settings = signing_settings()
    base = url or f"ws://{settings.daemon.host}:{settings.daemon.port}"
    api_base = api or f"http://{settings.api.host}:{settings.api.port}"
    ttl = parse_ttl(token_ttl)
    inbox = Inbox(since)

    def mint() -> str:
        return auth.mint(settings.auth.jwt_secret.get_secret_value(), user, ttl)

    def renew(why: str) -> str:
        typer.echo(f"chatctl listen: token {why}: minted a new one, resuming from {inbox.since}", err=True)
        return mint()

    async def ask_partition(token: str) -> int | None:
        return await partition_from_api(api_base, token)

    def routed(partition: int | None, why: str) -> None:
        typer.echo(f"chatctl listen: partition {partition} (from {why}), resuming from {inbox.since}", err=True)

    def write(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def show(frame: dict) -> None:
        write(render.line(frame) if output is Format.text else orjson.dumps(frame).decode())

    def greet(hello: dict) -> None:
        write(render.hello_line(hello))

    try:
        tok = mint()
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--as") from None
    watching = None if watch is None else [name for name in watch.split(",") if name]
    asyncio.run(run_listen(base, tok, since, show, count or None, inbox=inbox, renew=renew,
                           on_hello=greet if output is Format.text else None, watch=watching,
                           ask_partition=ask_partition, on_route=routed))


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


PAGE_HELP = "Rows copied per step; a target partition's writes pause for one step at a time"


@partitions_app.command("grow")
def partitions_grow(count: int = typer.Argument(..., help="The number of partitions to grow to"),
                    page: int = typer.Option(500, min=1, max=10_000, help=PAGE_HELP)) -> None:
    """Grow to COUNT partitions, online: the users of the slots that change partition move with their
    history; every process adopts the new map by itself. Rerun it, or `resume`, after a failure."""
    from chatctl import partitions

    _run_move(lambda settings: partitions.grow(settings, count, page=page))


@partitions_app.command("move")
def partitions_move(slots: str = typer.Argument(..., help="Slots to move: e.g. 0-99,512"),
                    to: int = typer.Option(..., "--to", help="The partition they move to (the next new one "
                                           "is made)"),
                    page: int = typer.Option(500, min=1, max=10_000, help=PAGE_HELP)) -> None:
    """Move SLOTS to partition TO, online, their users' history with them."""
    from chatctl import partitions

    _run_move(lambda settings: partitions.move(settings, partitions.parse_slots(slots), to, page=page))


@partitions_app.command("prepare")
def partitions_prepare(count: int = typer.Argument(..., help="The number of partitions to make room for")) -> None:
    """Create the tables and collections of COUNT partitions, nothing else: then grant them
    (deploy/mysql/grants.sql) before `grow COUNT`, so the writers can write them at the cutover."""
    from chatctl import partitions

    _run_move(lambda settings: partitions.prepare(settings, count))


@partitions_app.command("resume")
def partitions_resume(page: int = typer.Option(500, min=1, max=10_000, help=PAGE_HELP)) -> None:
    """Finish the move in progress (after a mover that died or was stopped)."""
    from chatctl import partitions

    _run_move(lambda settings: partitions.resume(settings, page=page))


def _run_move(run: Callable[[Settings], str]) -> None:
    from chatctl import partitions
    from db.partition_map import NoSlotMap

    try:
        typer.echo(run(Settings()))
    except (partitions.ChangeRefused, NoSlotMap) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None


if __name__ == "__main__":
    app()
