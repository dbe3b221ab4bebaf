"""One typed settings object, read once at each entry point, in sections by
the processes that read them: ``settings.auth``, ``settings.stores``,
``settings.signals``, ``settings.api``, ``settings.writer``, ``settings.daemon``,
``settings.tail``, ``settings.relay``, ``settings.push``, and ``settings.log_level``.

Values come from ``CHAT_*`` environment variables or a ``.env`` file in the
working directory. The variables stay flat (``CHAT_API_HOST``,
``CHAT_WRITER_SOCKET``, ...), as supervisord configs, ``deploy/`` and
``cluster/`` set them: each field names its own in ``Env``, most specific
first, so that a process's ``CHAT_WRITER_METRICS_PORT`` beats the
``CHAT_METRICS_PORT`` shared by all. No module reads ``os.environ`` on import:
entry points call ``Settings()`` and pass the object down.

In code, a section given to the constructor overrides only the fields it was
built with: ``Settings(daemon=DaemonSettings(ping_interval_seconds=1))`` keeps
the environment's daemon host, as the flat ``ping_interval_seconds=1`` did.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.exceptions import SettingsError

from chat.partitions import MAX_PARTITIONS, parse_served

# Public (it is in this file), so only development mode accepts it (chat.auth_config).
DEV_JWT_SECRET = "dev-secret-change-me-0123456789abcdef"

# Where a process with no TCP service of its own (the writer, the relay, the
# pusher) serves its metrics unless told otherwise: on the host only.
LOOPBACK = "127.0.0.1"


class Env:
    """A field's environment variables, most specific first: the first one set
    (in the environment, or else in the .env file) gives the value."""

    __slots__ = ("names",)

    def __init__(self, *names: str) -> None:
        self.names = names

    def __repr__(self) -> str:
        return f"Env{self.names!r}"


METRICS_PORT = ("A port of this process alone that serves /metrics (0: none): scrape each process here, not on the "
                "shared ports. `CHAT_METRICS_PORT` sets it for every process; supervisord gives each its own.")
METRICS_HOST = "Address of that port."


def _loopback_if_empty(value: str) -> str:
    """An empty ``CHAT_METRICS_HOST`` has always meant each process's own default."""
    return value or LOOPBACK


class _Section(BaseModel):
    # A misspelt setting in code fails loudly instead of leaving the default in force.
    model_config = ConfigDict(extra="forbid")


class AuthSettings(_Section):
    """Tokens: read by every process that signs or verifies them (API, daemons, `chatctl`)."""

    jwt_secret: Annotated[SecretStr, Env("CHAT_JWT_SECRET")] = Field(
        SecretStr(DEV_JWT_SECRET),
        description="HS256 key of client tokens: 32+ random bytes, the same on every host. This default, a "
        "placeholder or a shorter one is refused unless `CHAT_DEV_MODE` is on.",
    )
    dev_mode: Annotated[bool, Env("CHAT_DEV_MODE")] = Field(
        False, description="Development only (`make run` sets it): a weak `CHAT_JWT_SECRET` and "
        "`CHAT_DEV_LOGIN` are accepted.",
    )
    dev_login: Annotated[bool, Env("CHAT_DEV_LOGIN")] = Field(
        False, description="The API serves `POST /v1/dev/token`: log in as any user, no password. Needs "
        "`CHAT_DEV_MODE`.",
    )


class StoresSettings(_Section):
    """The databases and their layout: read by every process, `db.init` and `chatctl`."""

    mysql_url: Annotated[SecretStr, Env("CHAT_MYSQL_URL")] = Field(
        SecretStr("mysql+mysqldb://root@localhost/chat?unix_socket=var/mysql/mysqld.sock&charset=utf8mb4"),
        description="SQLAlchemy URL of the permanent store.",
    )
    mongo_url: Annotated[SecretStr, Env("CHAT_MONGO_URL")] = Field(
        SecretStr("mongodb://127.0.0.1:27017/?directConnection=true"),
        description="MongoDB URL of the fast store. Production: the replica set, with w=majority.",
    )
    mongo_db: Annotated[str, Env("CHAT_MONGO_DB")] = Field(
        "chat", description="MongoDB database that holds the `messages` collection.")
    redis_url: Annotated[SecretStr, Env("CHAT_REDIS_URL")] = Field(
        SecretStr("redis://127.0.0.1:6379/0"),
        description="Redis that carries typing and presence between daemons, API processes and hosts (one for "
        "all of them), and the writer's wakes of the tails. Empty: no typing or presence; messages are delivered "
        "either way.",
    )
    db_timeout_seconds: Annotated[float, Env("CHAT_DB_TIMEOUT_SECONDS")] = Field(
        2.0, gt=0, description="MySQL lock/statement, Mongo and Redis timeouts.")
    retention_seconds: Annotated[int, Env("CHAT_RETENTION_SECONDS")] = Field(
        86_400, ge=1, description="How long the fast store keeps a message.")
    sweep_interval_seconds: Annotated[float, Env("CHAT_SWEEP_INTERVAL_SECONDS")] = Field(
        30.0, gt=0, le=60, description="Retention sweeper period where TTL indexes are missing (FerretDB)."
    )
    oplog_max_docs: Annotated[int, Env("CHAT_OPLOG_MAX_DOCS")] = Field(
        100, ge=10, description="`max` of the capped local.oplog.rs that `db.init` creates (FerretDB only: each "
        "poll of a tail re-reads all of it, so every entry kept costs each host's relay at every poll; MongoDB "
        "keeps its own oplog).",
    )
    oplog_size_bytes: Annotated[int, Env("CHAT_OPLOG_SIZE_BYTES")] = Field(
        64 * 1024 * 1024, description="`size` of that capped oplog.")
    partitions: Annotated[int, Env("CHAT_PARTITIONS")] = Field(
        1, ge=1, le=64, description="Partitions of users (each its own sequence, writer lock, tables and stream) "
        "that `db.init` lays out when the store has no slot map yet; after that the map in MySQL rules.",
    )


class SignalsSettings(_Section):
    """Typing and presence (docs/presence.md): read by the daemons and the API."""

    presence_enabled: Annotated[bool, Env("CHAT_PRESENCE_ENABLED")] = Field(
        True, description="Track who is online. False: `/v1/presence` answers 404 and `watch` frames an error.",
    )
    typing_ttl_seconds: Annotated[float, Env("CHAT_TYPING_TTL_SECONDS")] = Field(
        5.0, gt=0, le=60, description="How long a `typing` start shows unless refreshed (the event's `ttl`).",
    )
    presence_grace_seconds: Annotated[float, Env("CHAT_PRESENCE_GRACE_SECONDS")] = Field(
        3.0, ge=0, le=60, description="A user whose last connection closed turns offline (and `last_seen` is "
        "stored) if none comes back within this.",
    )
    presence_watch_max: Annotated[int, Env("CHAT_PRESENCE_WATCH_MAX")] = Field(
        200, ge=0, le=1000, description="Users one connection may watch.")
    presence_daemon_timeout_seconds: Annotated[float, Env("CHAT_PRESENCE_DAEMON_TIMEOUT_SECONDS")] = Field(
        10.0, ge=4, le=300, description="A daemon whose Redis heartbeat (every 2 s) is older than this is dead: "
        "its users turn offline unless connected elsewhere.",
    )


class ApiSettings(_Section):
    """The write API processes (`python -m api`)."""

    host: Annotated[str, Env("CHAT_API_HOST")] = Field("127.0.0.1", description="Write API listen address.")
    port: Annotated[int, Env("CHAT_API_PORT")] = Field(
        8000, description="Write API port, shared by all API processes (SO_REUSEPORT).")
    max_connections: Annotated[int, Env("CHAT_API_MAX_CONNECTIONS")] = Field(
        4000, ge=1, description="Connections (idle too) or requests in hand at which an API process answers 503 "
        "`overloaded`, probes excepted.",
    )
    head_timeout_seconds: Annotated[float, Env("CHAT_API_HEAD_TIMEOUT_SECONDS")] = Field(
        10.0, gt=0, description="A write-API request head not complete this long after its first byte gets 408.",
    )
    http_idle_seconds: Annotated[float, Env("CHAT_HTTP_IDLE_SECONDS")] = Field(
        30.0, gt=0, description="A connection with no byte for this long is closed (the daemons' too).",
    )
    body_max_chars: Annotated[int, Env("CHAT_BODY_MAX_CHARS")] = Field(
        4000, ge=1, description="Longest message body, in characters (the writer sizes its frames by it).")
    request_max_bytes: Annotated[int, Env("CHAT_REQUEST_MAX_BYTES")] = Field(
        16 * 1024, description="Largest request body; larger gets 413.")
    rate_limit_per_second: Annotated[float, Env("CHAT_RATE_LIMIT_PER_SECOND")] = Field(
        20.0, ge=0, description="Messages per second one sender may post per API process; 0 disables."
    )
    rate_limit_burst: Annotated[int, Env("CHAT_RATE_LIMIT_BURST")] = Field(
        40, ge=1, description="Burst a sender may post before the limit applies.")
    public_daemon_url: Annotated[str, Env("CHAT_PUBLIC_DAEMON_URL")] = Field(
        "", description="Daemon base URL the web page connects to (production: the proxy). Empty: the "
        "page's host on `CHAT_DAEMON_PORT`.",
    )
    metrics_host: Annotated[str, Env("CHAT_API_METRICS_HOST", "CHAT_METRICS_HOST")] = Field(
        "", validate_default=True, description=f"{METRICS_HOST} Empty: `CHAT_API_HOST`.")
    metrics_port: Annotated[int, Env("CHAT_API_METRICS_PORT", "CHAT_METRICS_PORT")] = Field(
        0, ge=0, le=65535, description=METRICS_PORT)

    @field_validator("metrics_host")
    @classmethod
    def _metrics_on_the_listen_address(cls, value: str, info: ValidationInfo) -> str:
        return value or info.data.get("host", LOOPBACK)


# How often a leading writer reads the echoes owed to its partitions, by default: with Redis the
# commit that owes a copy wakes that read (writer/echo_wake.py), so the period bounds only a lost
# wake's delay; without it, every copy between hosts waits half of it on average.
ECHO_WATCH_MS_WOKEN = 1_000.0
ECHO_WATCH_MS_UNWOKEN = 50.0


class WriterSettings(_Section):
    """The host's writer process (`python -m writer`), and how API processes and daemons reach it."""

    socket: Annotated[str, Env("CHAT_WRITER_SOCKET")] = Field(
        "", description="Unix socket of the host's writer process. Empty: each API process writes for itself.",
    )
    wait_seconds: Annotated[float, Env("CHAT_WRITER_WAIT_SECONDS")] = Field(
        5.0, gt=0, description="How long a POST waits for the writer process to come back (a restart) before 503.",
    )
    queue_max: Annotated[int, Env("CHAT_WRITER_QUEUE_MAX")] = Field(
        10_000, ge=1, description="Messages queued for the writer before 503.")
    batch_max: Annotated[int, Env("CHAT_BATCH_MAX")] = Field(
        500, ge=1, description="Most messages one group commit writes.")
    batch_window_ms: Annotated[float, Env("CHAT_BATCH_WINDOW_MS")] = Field(
        2.0, ge=0, description="How long a group commit waits for company once a message is queued."
    )
    edit_window_seconds: Annotated[int, Env("CHAT_EDIT_WINDOW_SECONDS")] = Field(
        48 * 3600, ge=0, description="How long after sending a sender may edit or delete a message.",
    )
    leads: Annotated[str, Env("CHAT_WRITER_LEADS")] = Field(
        "", description="Partitions whose writes the proxy sends to this host first: `0,2`, or `%3=1` (every k "
        "with k mod 3 = 1, also those a grow adds); empty: all. This writer makes the copies owed to those, "
        "watching their echoes; the copies owed to the others are their leaders' to make.",
    )
    echo_watch_ms: Annotated[float | None, Env("CHAT_WRITER_ECHO_WATCH_MS")] = Field(
        None, gt=0, le=1000, description="With CHAT_WRITER_LEADS: how often a led partition's echoes (copies owed "
        "to it by other hosts' commits) are read, each read a statement for the writer and MySQL. Unset: "
        f"{ECHO_WATCH_MS_WOKEN:g} with Redis, where the commit that owes a copy wakes the leader's read through "
        f"`chat:echoes`, so only a lost wake waits it out; {ECHO_WATCH_MS_UNWOKEN:g} without, where a copy waits "
        "half of it on average.",
    )
    metrics_host: Annotated[str, Env("CHAT_WRITER_METRICS_HOST", "CHAT_METRICS_HOST")] = Field(
        LOOPBACK, description=f"{METRICS_HOST} Empty: {LOOPBACK} (the writer listens on a Unix socket only).")
    metrics_port: Annotated[int, Env("CHAT_WRITER_METRICS_PORT", "CHAT_METRICS_PORT")] = Field(
        0, ge=0, le=65535, description=METRICS_PORT)

    _metrics_host = field_validator("metrics_host")(_loopback_if_empty)

    @field_validator("leads")
    @classmethod
    def _a_partition_rule(cls, value: str) -> str:
        parse_served(value, MAX_PARTITIONS)  # refused at start, with the reason
        return value

    def led(self) -> frozenset[int] | None:
        """The partitions this host leads (of any map), or None: every one, and no other host leads any."""
        return parse_served(self.leads, MAX_PARTITIONS) if self.leads.strip() else None


class DaemonSettings(_Section):
    """The delivery daemons (`python -m daemon`): WebSockets and long-polls."""

    host: Annotated[str, Env("CHAT_DAEMON_HOST")] = Field("127.0.0.1", description="Daemon listen address.")
    port: Annotated[int, Env("CHAT_DAEMON_PORT")] = Field(
        8100, description="Daemon port, shared by all daemon processes (SO_REUSEPORT).")
    max_connections: Annotated[int, Env("CHAT_MAX_CONNECTIONS")] = Field(
        15_000, ge=1, le=18_000,
        description="Open sockets of any kind one daemon process holds; past it, handshakes and polls get 503 "
        "(the open-files limit is 20k)."
    )
    http_idle_seconds: Annotated[float, Env("CHAT_HTTP_IDLE_SECONDS")] = Field(
        30.0, gt=0, description="A connection with no whole HTTP request for this long is closed.",
    )
    partitions: Annotated[str, Env("CHAT_DAEMON_PARTITIONS")] = Field(
        "", description="Partitions this daemon serves: `0,2`, or `%2=0` (every k with k mod 2 = 0, also those a "
        "grow adds); empty: all. A client of another gets 421.",
    )
    send_buffer_max_bytes: Annotated[int, Env("CHAT_SEND_BUFFER_MAX_BYTES")] = Field(
        256 * 1024, ge=1024,
        description="Unsent bytes one client may fall behind by before it is closed (4008, slow consumer).",
    )
    ping_interval_seconds: Annotated[float, Env("CHAT_PING_INTERVAL_SECONDS")] = Field(
        20.0, gt=0, description="Server WebSocket ping period.")
    ping_timeout_seconds: Annotated[float, Env("CHAT_PING_TIMEOUT_SECONDS")] = Field(
        20.0, gt=0, description="Time for a pong before the peer is dropped.")
    close_stall_seconds: Annotated[float, Env("CHAT_CLOSE_STALL_SECONDS")] = Field(
        10.0, gt=0, description="A WebSocket being closed whose client reads nothing for this long (or for the "
        "ping timeout, if longer) is cut off.",
    )
    ws_auth_seconds: Annotated[float, Env("CHAT_WS_AUTH_SECONDS")] = Field(
        10.0, gt=0, description="A /v1/ws opened without a token must send its `auth` frame within this (else 4401).",
    )
    url_tokens_allowed: Annotated[bool, Env("CHAT_URL_TOKENS_ALLOWED")] = Field(
        False, description="Accept `?token=` on /v1/ws and /v1/poll. Off: a URL lands in proxies' error logs and "
        "browsers' history; clients send `Authorization: Bearer` or, on /v1/ws, an `auth` frame.",
    )
    ws_max_frame_bytes: Annotated[int, Env("CHAT_WS_MAX_FRAME_BYTES")] = Field(
        4096, ge=64, description="Largest inbound WebSocket frame (1009 past it).")
    ws_max_frames_per_second: Annotated[float, Env("CHAT_WS_MAX_FRAMES_PER_SECOND")] = Field(
        10.0, gt=0, description="Inbound frames per second (1008 past it).")
    allowed_origins: Annotated[list[str], Env("CHAT_ALLOWED_ORIGINS")] = Field(
        default_factory=lambda: ["http://localhost:8000", "http://127.0.0.1:8000"],
        description="Browser origins allowed to open /v1/ws (JSON list; `*` allows any). No Origin = not a browser.",
    )
    poll_max_messages: Annotated[int, Env("CHAT_POLL_MAX_MESSAGES")] = Field(
        1000, ge=1, description="Most messages in one /v1/poll answer; follow `cursor` for more.")
    poll_max_timeout_seconds: Annotated[float, Env("CHAT_POLL_MAX_TIMEOUT_SECONDS")] = Field(
        30.0, gt=0, le=30, description="Longest /v1/poll wait.")
    gap_check_seconds: Annotated[float, Env("CHAT_GAP_CHECK_SECONDS")] = Field(
        1.0, gt=0, description="Period of the query that finds messages the oplog never showed."
    )
    fill_holes_from_mysql: Annotated[bool, Env("CHAT_FILL_HOLES_FROM_MYSQL")] = Field(
        True, description="Daemons read the truth from MySQL by primary key: holes, what the fast store lacks "
        "yet, their start-up, the committed head they trust up to. False: `messages` alone (development only).",
    )
    recent_cache_max: Annotated[int, Env("CHAT_RECENT_CACHE_MAX")] = Field(
        50_000, ge=0, description="Recent messages each daemon keeps in memory to serve catch-up without a query."
    )
    recent_cache_max_bytes: Annotated[int, Env("CHAT_RECENT_CACHE_MAX_BYTES")] = Field(
        64 << 20, ge=0, description="Payload bytes that cache may hold at most; the oldest messages leave it first."
    )
    drain_seconds: Annotated[float, Env("CHAT_DRAIN_SECONDS")] = Field(
        5.0, ge=0, description="On SIGTERM: grace period after closing clients with 1012.")
    metrics_host: Annotated[str, Env("CHAT_DAEMON_METRICS_HOST", "CHAT_METRICS_HOST")] = Field(
        "", validate_default=True, description=f"{METRICS_HOST} Empty: `CHAT_DAEMON_HOST`.")
    metrics_port: Annotated[int, Env("CHAT_DAEMON_METRICS_PORT", "CHAT_METRICS_PORT")] = Field(
        0, ge=0, le=65535, description=METRICS_PORT)

    @field_validator("metrics_host")
    @classmethod
    def _metrics_on_the_listen_address(cls, value: str, info: ValidationInfo) -> str:
        return value or info.data.get("host", LOOPBACK)


# The FerretDB tail's longest wait between idle polls, by default: with a wake through Redis a
# write cuts it short, so only a lost wake waits it out; without one, every first message after
# a quiet spell may (docs/decisions/idle-costs-nothing.md).
IDLE_POLL_MS_WOKEN = 10_000.0
IDLE_POLL_MS_UNWOKEN = 2_000.0


class TailSettings(_Section):
    """The oplog tail: the relay's, or a daemon's own when `CHAT_OPLOG_RELAY_SOCKET` is empty."""

    silence_seconds: Annotated[float, Env("CHAT_TAIL_SILENCE_SECONDS")] = Field(
        30.0, gt=0, description="Watchdog: restart a tail silent this long.")
    ferretdb_poll_ms: Annotated[float, Env("CHAT_FERRETDB_TAIL_POLL_MS")] = Field(
        20.0, gt=0,
        description="FerretDB only: poll period of the oplog tail (no awaitData there). MongoDB: awaitData.",
    )
    ferretdb_idle_poll_ms: Annotated[float | None, Env("CHAT_FERRETDB_TAIL_IDLE_POLL_MS")] = Field(
        None, gt=0,
        description="FerretDB only: after a second of empty polls the tail's poll period doubles up to this. "
        f"Unset: {IDLE_POLL_MS_WOKEN:g} with Redis, whose wake from the writer (`chat:wake`) cuts the wait short "
        f"when a write commits; {IDLE_POLL_MS_UNWOKEN:g} without, where it bounds the delay of the first message "
        "after a quiet spell. Each poll of a full oplog costs FerretDB about 12 ms of CPU. MongoDB: awaitData, unused.",
    )


class RelaySettings(_Section):
    """The host's oplog relay (`python -m relay`), and where the daemons find it."""

    socket: Annotated[str, Env("CHAT_OPLOG_RELAY_SOCKET")] = Field(
        "", description="Unix socket of the host's oplog relay. Empty: each daemon tails the oplog itself.",
    )
    route_by_user: Annotated[bool, Env("CHAT_RELAY_ROUTE_BY_USER")] = Field(
        True, description="Daemons tell the relay which users they hold and get those users' entries only (and the "
        "other ids): each decodes its share of the users, so N daemons of a host use N cores "
        "(docs/decisions/relay-by-user.md). False: each gets and decodes every entry of its partitions.",
    )
    user_linger_seconds: Annotated[float, Env("CHAT_RELAY_USER_LINGER_SECONDS")] = Field(
        5.0, ge=0, description="Routed by user: a daemon keeps a user after its last socket for this long, so that "
        "a long-poll's next request, or a quick reconnect, finds it still served.",
    )
    metrics_host: Annotated[str, Env("CHAT_RELAY_METRICS_HOST", "CHAT_METRICS_HOST")] = Field(
        LOOPBACK, description=f"{METRICS_HOST} Empty: {LOOPBACK} (the relay listens on a Unix socket only).")
    metrics_port: Annotated[int, Env("CHAT_RELAY_METRICS_PORT", "CHAT_METRICS_PORT")] = Field(
        0, ge=0, le=65535, description=METRICS_PORT)

    _metrics_host = field_validator("metrics_host")(_loopback_if_empty)


class PushSettings(_Section):
    """Push notifications: the pusher process (`python -m pusher`), and the API's device registrations."""

    gateway_url: Annotated[str, Env("CHAT_PUSH_GATEWAY_URL")] = Field(
        "", description="Base URL of a Matrix Push Gateway (Sygnal, or a compatible one): the pusher POSTs "
        "`{url}/_matrix/push/v1/notify`. Empty: the pusher sends nothing and exits.",
    )
    delay_seconds: Annotated[float, Env("CHAT_PUSH_DELAY_SECONDS")] = Field(
        3.0, ge=0, description="A message no device of its recipient received (acked) or read this long after it "
        "was sent is pushed to the recipient's registered devices.",
    )
    content: Annotated[Literal["none", "sender", "full"], Env("CHAT_PUSH_CONTENT")] = Field(
        "none", description="What a notification tells the gateway: ids and counts only (`none`), plus the "
        "sender (`sender`), plus the body (`full`).",
    )
    give_up_seconds: Annotated[float, Env("CHAT_PUSH_GIVE_UP_SECONDS")] = Field(
        600.0, gt=0, description="How long the pusher retries a notification the gateway does not accept.",
    )
    outbox_max: Annotated[int, Env("CHAT_PUSH_OUTBOX_MAX")] = Field(
        10_000, ge=1, description="Notifications a partition's outbox holds at which its pusher decides no further "
        "until the gateway takes some: the queue stays bounded while the gateway is down.",
    )
    devices_max: Annotated[int, Env("CHAT_PUSH_DEVICES_MAX")] = Field(
        10, ge=1, le=100, description="Push devices one user may register.")
    metrics_host: Annotated[str, Env("CHAT_PUSH_METRICS_HOST", "CHAT_METRICS_HOST")] = Field(
        LOOPBACK, description=f"{METRICS_HOST} Empty: {LOOPBACK} (the pusher listens on no other port).")
    metrics_port: Annotated[int, Env("CHAT_PUSH_METRICS_PORT", "CHAT_METRICS_PORT")] = Field(
        0, ge=0, le=65535, description=f"{METRICS_PORT} The pusher's is also its readiness: it listens once started.")

    _metrics_host = field_validator("metrics_host")(_loopback_if_empty)


def env_names_of(field: FieldInfo) -> tuple[str, ...]:
    """The environment variables that set ``field``, most specific first (none: not an ``Env`` field)."""
    return next((m.names for m in field.metadata if isinstance(m, Env)), ())


def _section_of(field: FieldInfo) -> type[BaseModel] | None:
    annotation = field.annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, _Section) else None


class _FlatEnvironment(PydanticBaseSettingsSource):
    """Every field from its own ``CHAT_*`` variables (``Env``), the environment's
    over the .env file's: pydantic-settings would look for ``CHAT_API`` (JSON) or
    ``CHAT_API__HOST`` instead, names no operator sets."""

    def __init__(self, settings_cls: type[BaseSettings], environ: EnvSettingsSource,
                 dotenv: DotEnvSettingsSource) -> None:
        super().__init__(settings_cls)
        self._decoder = environ
        # Keys are lower-cased by pydantic-settings unless case_sensitive.
        self._vars = {key.lower(): value for key, value in {**dotenv.env_vars, **environ.env_vars}.items()}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads each field's own variables

    def _read(self, fields: dict[str, FieldInfo]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name, field in fields.items():
            for env in env_names_of(field):
                raw = self._vars.get(env.lower())
                if raw is None:
                    continue
                try:  # a list (CHAT_ALLOWED_ORIGINS) is JSON, as pydantic-settings reads it
                    found[name] = json.loads(raw) if self._decoder.field_is_complex(field) else raw
                except ValueError as e:
                    raise SettingsError(f"{env} is not valid JSON: {raw!r}") from e
                break
        return found

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            section = _section_of(field)
            if section is None:
                values.update(self._read({name: field}))
            elif found := self._read(section.model_fields):
                values[name] = found
        return values


class _SetFieldsOfSections(PydanticBaseSettingsSource):
    """The constructor's keywords, a section reduced to the fields it was built
    with: merged over the environment's, they override those alone."""

    def __init__(self, settings_cls: type[BaseSettings], init: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._init = init

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ hands the keywords on

    def __call__(self) -> dict[str, Any]:
        return {name: value.model_dump(exclude_unset=True) if isinstance(value, _Section) else value
                for name, value in self._init().items()}


class Settings(BaseSettings):
    # forbid: a keyword of no section (a flat name of old, a typo) fails instead of being ignored.
    model_config = SettingsConfigDict(env_file=".env", extra="forbid")

    auth: AuthSettings = Field(default_factory=AuthSettings)
    stores: StoresSettings = Field(default_factory=StoresSettings)
    signals: SignalsSettings = Field(default_factory=SignalsSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    writer: WriterSettings = Field(default_factory=WriterSettings)
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    tail: TailSettings = Field(default_factory=TailSettings)
    relay: RelaySettings = Field(default_factory=RelaySettings)
    push: PushSettings = Field(default_factory=PushSettings)
    log_level: Annotated[str, Env("CHAT_LOG_LEVEL")] = Field("INFO", description="Log level of every process.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        assert isinstance(env_settings, EnvSettingsSource) and isinstance(dotenv_settings, DotEnvSettingsSource)
        return (_SetFieldsOfSections(settings_cls, init_settings),
                _FlatEnvironment(settings_cls, env_settings, dotenv_settings))

    def ferretdb_idle_poll_seconds(self) -> float:
        """``tail.ferretdb_idle_poll_ms`` in seconds, or its default for whether writes wake the tail."""
        if self.tail.ferretdb_idle_poll_ms is not None:
            return self.tail.ferretdb_idle_poll_ms / 1000
        woken = bool(self.stores.redis_url.get_secret_value())
        return (IDLE_POLL_MS_WOKEN if woken else IDLE_POLL_MS_UNWOKEN) / 1000

    def echo_watch_seconds(self) -> float:
        """``writer.echo_watch_ms`` in seconds, or its default for whether commits wake the watch."""
        if self.writer.echo_watch_ms is not None:
            return self.writer.echo_watch_ms / 1000
        woken = bool(self.stores.redis_url.get_secret_value())
        return (ECHO_WATCH_MS_WOKEN if woken else ECHO_WATCH_MS_UNWOKEN) / 1000

    @classmethod
    def field(cls, path: str) -> FieldInfo:
        """The field at ``path``, e.g. ``"api.body_max_chars"`` (its coded ``default``, its ``description``)."""
        section, _, name = path.rpartition(".")
        owner = _section_of(cls.model_fields[section]) if section else cls
        assert owner is not None, f"{section} is not a section"
        return owner.model_fields[name]


def fields() -> list[tuple[str, FieldInfo]]:
    """Every setting as (dotted path, field), in the order of the sections."""
    found = []
    for name, field in Settings.model_fields.items():
        section = _section_of(field)
        if section is None:
            found.append((name, field))
        else:
            found.extend((f"{name}.{sub}", subfield) for sub, subfield in section.model_fields.items())
    return found


def _refuse_fields_without_env() -> None:
    """A field that names no variable could not be set by an operator: refused at import."""
    if unnamed := [path for path, field in fields() if not env_names_of(field)]:
        raise TypeError(f"settings without Env(...): {unnamed}")


_refuse_fields_without_env()


def env_names() -> set[str]:
    """Every environment variable the settings read."""
    return {env for _, field in fields() for env in env_names_of(field)}


def markdown_table() -> str:
    """The settings tables of docs/settings.md, one a section, generated so that
    they cannot drift (tests/core/test_readme.py)."""
    out: list[str] = []
    for name, field in Settings.model_fields.items():
        section = _section_of(field)
        members = [(f"{name}.{sub}", f) for sub, f in section.model_fields.items()] if section else [(name, field)]
        heading = f"`settings.{name}`: {(section.__doc__ or '').strip()}" if section else "Every process"
        out += [f"### {heading}", "", "| setting | variable | default | meaning |", "|---|---|---|---|"]
        for path, member in members:
            default = member.get_default(call_default_factory=True)
            if isinstance(default, SecretStr):
                default = default.get_secret_value()
            variables = ", else ".join(f"`{env}`" for env in env_names_of(member))
            out.append(f"| `{path}` | {variables} | `{default}` | {member.description} |")
        out.append("")
    return "\n".join(out).rstrip("\n")


if __name__ == "__main__":
    print(markdown_table())
