"""One typed settings object, read once at each entry point.

Values come from ``CHAT_*`` environment variables or a ``.env`` file in the
working directory. No module reads ``os.environ`` on import: entry points call
``Settings()`` and pass the object down.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

# Public (it is in this file), so only development mode accepts it (chat.auth_config).
DEV_JWT_SECRET = "dev-secret-change-me-0123456789abcdef"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHAT_", env_file=".env", extra="ignore")

    # --- auth ---------------------------------------------------------------
    jwt_secret: SecretStr = Field(
        SecretStr(DEV_JWT_SECRET),
        description="HS256 key of client tokens: 32+ random bytes, the same on every host. This default, a "
        "placeholder or a shorter one is refused unless `CHAT_DEV_MODE` is on.",
    )
    dev_mode: bool = Field(
        False, description="Development only (`make run` sets it): a weak `CHAT_JWT_SECRET` and "
        "`CHAT_DEV_LOGIN` are accepted.",
    )

    # --- stores -------------------------------------------------------------
    mysql_url: SecretStr = Field(
        SecretStr("mysql+mysqldb://root@localhost/chat?unix_socket=var/mysql/mysqld.sock&charset=utf8mb4"),
        description="SQLAlchemy URL of the permanent store.",
    )
    mongo_url: SecretStr = Field(
        SecretStr("mongodb://127.0.0.1:27017/?directConnection=true"),
        description="MongoDB URL of the fast store. Production: the replica set, with w=majority.",
    )
    mongo_db: str = Field("chat", description="MongoDB database that holds the `messages` collection.")
    retention_seconds: int = Field(86_400, ge=1, description="How long the fast store keeps a message.")
    edit_window_seconds: int = Field(
        48 * 3600, ge=0, description="How long after sending a sender may edit or delete a message.",
    )
    sweep_interval_seconds: float = Field(
        30.0, gt=0, le=60, description="Retention sweeper period where TTL indexes are missing (FerretDB)."
    )
    oplog_max_docs: int = Field(
        200, ge=10, description="`max` of the capped local.oplog.rs that `db.init` creates (FerretDB only)."
    )
    oplog_size_bytes: int = Field(64 * 1024 * 1024, description="`size` of that capped oplog.")

    partitions: int = Field(
        1, ge=1, le=64, description="Partitions of users (each its own sequence, writer lock, tables and stream) "
        "that `db.init` lays out when the store has no slot map yet; after that the map in MySQL rules.",
    )

    # --- write API ------------------------------------------------------------
    api_host: str = Field("127.0.0.1", description="Write API listen address.")
    api_port: int = Field(8000, description="Write API port, shared by all API processes (SO_REUSEPORT).")
    api_max_connections: int = Field(
        4000, ge=1, description="Connections (idle too) or requests in hand at which an API process answers 503 "
        "`overloaded`, probes excepted.",
    )
    body_max_chars: int = Field(4000, ge=1, description="Longest message body, in characters.")
    request_max_bytes: int = Field(16 * 1024, description="Largest request body; larger gets 413.")
    rate_limit_per_second: float = Field(
        20.0, ge=0, description="Messages per second one sender may post per API process; 0 disables."
    )
    rate_limit_burst: int = Field(40, ge=1, description="Burst a sender may post before the limit applies.")
    batch_max: int = Field(500, ge=1, description="Most messages one group commit writes.")
    batch_window_ms: float = Field(
        2.0, ge=0, description="How long a group commit waits for company once a message is queued."
    )
    writer_queue_max: int = Field(10_000, ge=1, description="Messages queued for the writer before 503.")
    writer_socket: str = Field(
        "", description="Unix socket of the host's writer process (`python -m writer`). Empty: each API process "
        "writes for itself.",
    )
    writer_wait_seconds: float = Field(
        5.0, gt=0, description="How long a POST waits for the writer process to come back (a restart) before 503.",
    )
    db_timeout_seconds: float = Field(2.0, gt=0, description="MySQL lock/statement and Mongo timeouts.")
    dev_login: bool = Field(
        False, description="Serve `POST /v1/dev/token`: log in as any user, no password. Needs "
        "`CHAT_DEV_MODE`.",
    )
    public_daemon_url: str = Field(
        "", description="Daemon base URL the web page connects to (production: the proxy). Empty: the "
        "page's host on `CHAT_DAEMON_PORT`.",
    )

    # --- delivery daemons ---------------------------------------------------
    daemon_host: str = Field("127.0.0.1", description="Daemon listen address.")
    daemon_port: int = Field(8100, description="Daemon port, shared by all daemon processes (SO_REUSEPORT).")
    max_connections: int = Field(
        15_000, ge=1, le=18_000,
        description="Open sockets of any kind one daemon process holds; past it, handshakes and polls get 503 "
        "(the open-files limit is 20k)."
    )
    api_head_timeout_seconds: float = Field(
        10.0, gt=0, description="A write-API request head not complete this long after its first byte gets 408.",
    )
    http_idle_seconds: float = Field(
        30.0, gt=0, description="A connection with no whole HTTP request (daemon) or no byte (API) for this long "
        "is closed.",
    )
    send_buffer_max_bytes: int = Field(
        256 * 1024, ge=1024,
        description="Unsent bytes one client may fall behind by before it is closed (4008, slow consumer).",
    )
    ping_interval_seconds: float = Field(20.0, gt=0, description="Server WebSocket ping period.")
    close_stall_seconds: float = Field(
        10.0, gt=0, description="A WebSocket being closed whose client reads nothing for this long (or for the "
        "ping timeout, if longer) is cut off.",
    )
    ping_timeout_seconds: float = Field(20.0, gt=0, description="Time for a pong before the peer is dropped.")
    ws_auth_seconds: float = Field(
        10.0, gt=0, description="A /v1/ws opened without a token must send its `auth` frame within this (else 4401).",
    )
    url_tokens_allowed: bool = Field(
        False, description="Accept `?token=` on /v1/ws and /v1/poll. Off: a URL lands in proxies' error logs and "
        "browsers' history; clients send `Authorization: Bearer` or, on /v1/ws, an `auth` frame.",
    )
    ws_max_frame_bytes: int = Field(4096, ge=64, description="Largest inbound WebSocket frame (1009 past it).")
    ws_max_frames_per_second: float = Field(10.0, gt=0, description="Inbound frames per second (1008 past it).")
    allowed_origins: list[str] = Field(
        default_factory=lambda: ["http://localhost:8000", "http://127.0.0.1:8000"],
        description="Browser origins allowed to open /v1/ws (JSON list; `*` allows any). No Origin = not a browser.",
    )
    poll_max_messages: int = Field(
        1000, ge=1, description="Most messages in one /v1/poll answer; follow `cursor` for more.")
    poll_max_timeout_seconds: float = Field(30.0, gt=0, le=30, description="Longest /v1/poll wait.")
    gap_check_seconds: float = Field(
        1.0, gt=0, description="Period of the query that finds messages the oplog never showed."
    )
    daemon_partitions: str = Field(
        "", description="Partitions this daemon serves, e.g. `0,2` (empty: all). A client of another gets 421.",
    )
    oplog_relay_socket: str = Field(
        "", description="Unix socket of the host's oplog relay (`python -m relay`). Empty: each daemon tails the "
        "oplog itself.",
    )
    tail_silence_seconds: float = Field(30.0, gt=0, description="Watchdog: restart a tail silent this long.")
    fill_holes_from_mysql: bool = Field(
        True, description="Daemons read the truth from MySQL by primary key: holes, what the fast store lacks "
        "yet, their start-up, the committed head they trust up to. False: `messages` alone (development only).",
    )
    ferretdb_tail_poll_ms: float = Field(
        20.0, gt=0,
        description="FerretDB only: poll period of the oplog tail (no awaitData there). MongoDB: awaitData.",
    )
    ferretdb_tail_idle_poll_ms: float = Field(
        2000.0, gt=0,
        description="FerretDB only: after a second of empty polls the tail's poll period doubles up to this; the "
        "writer's wake through Redis (`chat:wake`) cuts it short when a write commits. Without Redis it bounds the "
        "delay of the first message after a quiet spell. MongoDB: awaitData, unused.",
    )
    drain_seconds: float = Field(5.0, ge=0, description="On SIGTERM: grace period after closing clients with 1012.")
    recent_cache_max: int = Field(
        50_000, ge=0, description="Recent messages each daemon keeps in memory to serve catch-up without a query."
    )
    recent_cache_max_bytes: int = Field(
        64 << 20, ge=0, description="Payload bytes that cache may hold at most; the oldest messages leave it first."
    )

    # --- typing and presence (docs/presence.md) ------------------------------------
    redis_url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:6379/0"),
        description="Redis that carries typing and presence between daemons, API processes and hosts (one for "
        "all of them). Empty: no typing or presence; messages are delivered either way.",
    )
    presence_enabled: bool = Field(
        True, description="Track who is online. False: `/v1/presence` answers 404 and `watch` frames an error.",
    )
    typing_ttl_seconds: float = Field(
        5.0, gt=0, le=60, description="How long a `typing` start shows unless refreshed (the event's `ttl`).",
    )
    presence_grace_seconds: float = Field(
        3.0, ge=0, le=60, description="A user whose last connection closed turns offline (and `last_seen` is "
        "stored) if none comes back within this.",
    )
    presence_watch_max: int = Field(200, ge=0, le=1000, description="Users one connection may watch.")
    presence_daemon_timeout_seconds: float = Field(
        10.0, ge=4, le=300, description="A daemon whose Redis heartbeat (every 2 s) is older than this is dead: "
        "its users turn offline unless connected elsewhere.",
    )

    # --- push (the pusher process) -----------------------------------------------
    push_gateway_url: str = Field(
        "", description="Base URL of a Matrix Push Gateway (Sygnal, or a compatible one): the pusher POSTs "
        "`{url}/_matrix/push/v1/notify`. Empty: the pusher sends nothing and exits.",
    )
    push_delay_seconds: float = Field(
        3.0, ge=0, description="A message no device of its recipient received (acked) or read this long after it "
        "was sent is pushed to the recipient's registered devices.",
    )
    push_content: Literal["none", "sender", "full"] = Field(
        "none", description="What a notification tells the gateway: ids and counts only (`none`), plus the "
        "sender (`sender`), plus the body (`full`).",
    )
    push_give_up_seconds: float = Field(
        600.0, gt=0, description="How long the pusher retries a notification the gateway does not accept.",
    )
    push_outbox_max: int = Field(
        10_000, ge=1, description="Notifications a partition's outbox holds at which its pusher decides no further "
        "until the gateway takes some: the queue stays bounded while the gateway is down.",
    )
    push_devices_max: int = Field(10, ge=1, le=100, description="Push devices one user may register.")

    metrics_port: int = Field(
        0, ge=0, le=65535, description="A port of this process alone that serves /metrics (0: none): scrape each "
        "process here, not on the shared ports.",
    )
    metrics_host: str = Field(
        "", description="Address of that port. Empty: the process's own listen address (`CHAT_API_HOST`, "
        "`CHAT_DAEMON_HOST`); the writer and the relay, which listen on Unix sockets only, use 127.0.0.1.",
    )
    log_level: str = Field("INFO", description="Log level of every process.")


def markdown_table() -> str:
    """The settings table of docs/settings.md, generated so that it cannot drift (tests/core/test_readme.py)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if isinstance(default, SecretStr):
            default = default.get_secret_value()
        rows.append(f"| `CHAT_{name.upper()}` | `{default}` | {field.description} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
