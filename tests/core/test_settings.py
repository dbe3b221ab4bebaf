"""The settings in sections read the same ``CHAT_*`` variables as the flat
settings of before: operators' supervisord configs, deploy/ and cluster/ set
those names, and each must still set what it meant."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from chat.settings import ApiSettings, DaemonSettings, Settings, StoresSettings, env_names, fields

PROCESSES = ("api", "writer", "daemon", "relay", "push")

# Every variable docs/settings.md listed while the settings were one flat class,
# with a value unlike its default, the field(s) it set and the value they take.
FLAT_NAMES: dict[str, tuple[str, tuple[str, ...], object]] = {
    "CHAT_JWT_SECRET": ("k" * 40, ("auth.jwt_secret",), "k" * 40),
    "CHAT_DEV_MODE": ("true", ("auth.dev_mode",), True),
    "CHAT_MYSQL_URL": ("mysql+mysqldb://u@db/chat", ("stores.mysql_url",), "mysql+mysqldb://u@db/chat"),
    "CHAT_MONGO_URL": ("mongodb://db:27017/", ("stores.mongo_url",), "mongodb://db:27017/"),
    "CHAT_MONGO_DB": ("other", ("stores.mongo_db",), "other"),
    "CHAT_RETENTION_SECONDS": ("3600", ("stores.retention_seconds",), 3600),
    "CHAT_EDIT_WINDOW_SECONDS": ("60", ("writer.edit_window_seconds",), 60),
    "CHAT_SWEEP_INTERVAL_SECONDS": ("7.5", ("stores.sweep_interval_seconds",), 7.5),
    "CHAT_OPLOG_MAX_DOCS": ("500", ("stores.oplog_max_docs",), 500),
    "CHAT_OPLOG_SIZE_BYTES": ("1048576", ("stores.oplog_size_bytes",), 1048576),
    "CHAT_PARTITIONS": ("4", ("stores.partitions",), 4),
    # The listen address is also the metrics address unless CHAT_METRICS_HOST says otherwise.
    "CHAT_API_HOST": ("10.0.0.2", ("api.host", "api.metrics_host"), "10.0.0.2"),
    "CHAT_API_PORT": ("8001", ("api.port",), 8001),
    "CHAT_API_MAX_CONNECTIONS": ("100", ("api.max_connections",), 100),
    "CHAT_BODY_MAX_CHARS": ("100", ("api.body_max_chars",), 100),
    "CHAT_REQUEST_MAX_BYTES": ("2048", ("api.request_max_bytes",), 2048),
    "CHAT_RATE_LIMIT_PER_SECOND": ("0", ("api.rate_limit_per_second",), 0.0),
    "CHAT_RATE_LIMIT_BURST": ("3", ("api.rate_limit_burst",), 3),
    "CHAT_BATCH_MAX": ("50", ("writer.batch_max",), 50),
    "CHAT_BATCH_WINDOW_MS": ("0.5", ("writer.batch_window_ms",), 0.5),
    "CHAT_WRITER_QUEUE_MAX": ("20", ("writer.queue_max",), 20),
    "CHAT_WRITER_SOCKET": ("/run/w.sock", ("writer.socket",), "/run/w.sock"),
    "CHAT_WRITER_WAIT_SECONDS": ("1.5", ("writer.wait_seconds",), 1.5),
    "CHAT_DB_TIMEOUT_SECONDS": ("0.25", ("stores.db_timeout_seconds",), 0.25),
    "CHAT_DEV_LOGIN": ("true", ("auth.dev_login",), True),
    "CHAT_PUBLIC_DAEMON_URL": ("https://chat.example", ("api.public_daemon_url",), "https://chat.example"),
    "CHAT_DAEMON_HOST": ("10.0.0.3", ("daemon.host", "daemon.metrics_host"), "10.0.0.3"),
    "CHAT_DAEMON_PORT": ("8101", ("daemon.port",), 8101),
    "CHAT_MAX_CONNECTIONS": ("99", ("daemon.max_connections",), 99),
    "CHAT_API_HEAD_TIMEOUT_SECONDS": ("3", ("api.head_timeout_seconds",), 3.0),
    "CHAT_HTTP_IDLE_SECONDS": ("4", ("api.http_idle_seconds", "daemon.http_idle_seconds"), 4.0),
    "CHAT_SEND_BUFFER_MAX_BYTES": ("4096", ("daemon.send_buffer_max_bytes",), 4096),
    "CHAT_PING_INTERVAL_SECONDS": ("5", ("daemon.ping_interval_seconds",), 5.0),
    "CHAT_CLOSE_STALL_SECONDS": ("6", ("daemon.close_stall_seconds",), 6.0),
    "CHAT_PING_TIMEOUT_SECONDS": ("7", ("daemon.ping_timeout_seconds",), 7.0),
    "CHAT_WS_AUTH_SECONDS": ("8", ("daemon.ws_auth_seconds",), 8.0),
    "CHAT_URL_TOKENS_ALLOWED": ("true", ("daemon.url_tokens_allowed",), True),
    "CHAT_WS_MAX_FRAME_BYTES": ("128", ("daemon.ws_max_frame_bytes",), 128),
    "CHAT_WS_MAX_FRAMES_PER_SECOND": ("2.5", ("daemon.ws_max_frames_per_second",), 2.5),
    "CHAT_ALLOWED_ORIGINS": ('["https://a.example"]', ("daemon.allowed_origins",), ["https://a.example"]),
    "CHAT_POLL_MAX_MESSAGES": ("10", ("daemon.poll_max_messages",), 10),
    "CHAT_POLL_MAX_TIMEOUT_SECONDS": ("9", ("daemon.poll_max_timeout_seconds",), 9.0),
    "CHAT_GAP_CHECK_SECONDS": ("0.5", ("daemon.gap_check_seconds",), 0.5),
    "CHAT_DAEMON_PARTITIONS": ("0,2", ("daemon.partitions",), "0,2"),
    "CHAT_OPLOG_RELAY_SOCKET": ("/run/r.sock", ("relay.socket",), "/run/r.sock"),
    "CHAT_TAIL_SILENCE_SECONDS": ("11", ("tail.silence_seconds",), 11.0),
    "CHAT_FILL_HOLES_FROM_MYSQL": ("false", ("daemon.fill_holes_from_mysql",), False),
    "CHAT_FERRETDB_TAIL_POLL_MS": ("5", ("tail.ferretdb_poll_ms",), 5.0),
    "CHAT_FERRETDB_TAIL_IDLE_POLL_MS": ("500", ("tail.ferretdb_idle_poll_ms",), 500.0),
    "CHAT_DRAIN_SECONDS": ("1", ("daemon.drain_seconds",), 1.0),
    "CHAT_RECENT_CACHE_MAX": ("5", ("daemon.recent_cache_max",), 5),
    "CHAT_RECENT_CACHE_MAX_BYTES": ("1024", ("daemon.recent_cache_max_bytes",), 1024),
    "CHAT_REDIS_URL": ("", ("stores.redis_url",), ""),
    "CHAT_PRESENCE_ENABLED": ("false", ("signals.presence_enabled",), False),
    "CHAT_TYPING_TTL_SECONDS": ("2", ("signals.typing_ttl_seconds",), 2.0),
    "CHAT_PRESENCE_GRACE_SECONDS": ("1", ("signals.presence_grace_seconds",), 1.0),
    "CHAT_PRESENCE_WATCH_MAX": ("7", ("signals.presence_watch_max",), 7),
    "CHAT_PRESENCE_DAEMON_TIMEOUT_SECONDS": ("20", ("signals.presence_daemon_timeout_seconds",), 20.0),
    "CHAT_PUSH_GATEWAY_URL": ("http://sygnal:5000", ("push.gateway_url",), "http://sygnal:5000"),
    "CHAT_PUSH_DELAY_SECONDS": ("0", ("push.delay_seconds",), 0.0),
    "CHAT_PUSH_CONTENT": ("full", ("push.content",), "full"),
    "CHAT_PUSH_GIVE_UP_SECONDS": ("30", ("push.give_up_seconds",), 30.0),
    "CHAT_PUSH_DEVICES_MAX": ("3", ("push.devices_max",), 3),
    # Shared by every process then, the default of each process's own now.
    "CHAT_METRICS_PORT": ("9999", tuple(f"{p}.metrics_port" for p in PROCESSES), 9999),
    "CHAT_METRICS_HOST": ("10.0.0.9", tuple(f"{p}.metrics_host" for p in PROCESSES), "10.0.0.9"),
    "CHAT_LOG_LEVEL": ("DEBUG", ("log_level",), "DEBUG"),
}


@pytest.fixture
def clean_env(monkeypatch):
    """No CHAT_* variable of the test's own environment."""
    import os
    for key in list(os.environ):
        if key.startswith("CHAT_"):
            monkeypatch.delenv(key)
    return monkeypatch


def at(settings: Settings, path: str) -> object:
    value: object = settings
    for name in path.split("."):
        value = getattr(value, name)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def test_every_variable_of_the_flat_settings_is_still_read():
    assert set(FLAT_NAMES) <= env_names(), set(FLAT_NAMES) - env_names()


@pytest.mark.parametrize("name", sorted(FLAT_NAMES))
def test_each_variable_of_the_flat_settings_sets_the_field_it_meant_and_no_other(name, clean_env):
    raw, paths, expected = FLAT_NAMES[name]
    before = Settings(_env_file=None)
    clean_env.setenv(name, raw)
    after = Settings(_env_file=None)
    for path in paths:
        assert at(after, path) == expected, path
    changed = {path for path, _ in fields() if at(after, path) != at(before, path)}
    assert changed == set(paths)


def test_a_process_s_own_metrics_variables_beat_the_shared_ones(clean_env):
    clean_env.setenv("CHAT_METRICS_PORT", "9000")
    clean_env.setenv("CHAT_METRICS_HOST", "10.0.0.1")
    clean_env.setenv("CHAT_WRITER_METRICS_PORT", "9200")
    clean_env.setenv("CHAT_RELAY_METRICS_HOST", "10.0.0.5")
    settings = Settings(_env_file=None)
    assert settings.writer.metrics_port == 9200 and settings.relay.metrics_host == "10.0.0.5"
    assert [settings.api.metrics_port, settings.daemon.metrics_port, settings.relay.metrics_port,
            settings.push.metrics_port] == [9000] * 4
    assert [settings.api.metrics_host, settings.writer.metrics_host, settings.daemon.metrics_host,
            settings.push.metrics_host] == ["10.0.0.1"] * 4


@pytest.mark.parametrize("shared", [None, ""])
def test_without_a_metrics_host_each_process_serves_its_metrics_on_its_own_default(shared, clean_env):
    """The API and the daemons on their listen address, the writer, the relay and
    the pusher (Unix sockets or no port) on the loopback; an empty
    CHAT_METRICS_HOST has always meant the same."""
    if shared is not None:
        clean_env.setenv("CHAT_METRICS_HOST", shared)
    clean_env.setenv("CHAT_API_HOST", "10.0.0.2")
    clean_env.setenv("CHAT_DAEMON_HOST", "10.0.0.3")
    settings = Settings(_env_file=None)
    assert settings.api.metrics_host == "10.0.0.2" and settings.daemon.metrics_host == "10.0.0.3"
    assert settings.writer.metrics_host == settings.relay.metrics_host == settings.push.metrics_host == "127.0.0.1"


def test_the_env_file_is_read_and_the_environment_wins_over_it(clean_env, tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text("CHAT_API_PORT=8001\nCHAT_DAEMON_PORT=8101\nCHAT_WRITER_METRICS_PORT=9201\n")
    clean_env.setenv("CHAT_DAEMON_PORT", "8102")
    clean_env.setenv("CHAT_METRICS_PORT", "9000")
    settings = Settings(_env_file=env_file)
    assert (settings.api.port, settings.daemon.port) == (8001, 8102)
    assert (settings.writer.metrics_port, settings.api.metrics_port) == (9201, 9000)  # the more specific name wins


def test_a_section_given_in_code_overrides_only_the_fields_it_was_built_with(clean_env):
    clean_env.setenv("CHAT_DAEMON_HOST", "10.0.0.3")
    clean_env.setenv("CHAT_MONGO_DB", "from-env")
    settings = Settings(_env_file=None, daemon=DaemonSettings(ping_interval_seconds=1),
                        stores=StoresSettings(mysql_url="mysql+mysqldb://u@db/chat"))
    assert settings.daemon.ping_interval_seconds == 1 and settings.daemon.host == "10.0.0.3"
    assert settings.daemon.metrics_host == "10.0.0.3"  # resolved against the merged section
    assert settings.stores.mysql_url.get_secret_value() == "mysql+mysqldb://u@db/chat"
    assert settings.stores.mongo_db == "from-env"


def test_a_flat_keyword_or_a_misspelt_field_is_refused(clean_env):
    """Ignored, they would leave a default in force without a word."""
    flat = {"api_host": "10.0.0.2"}  # a keyword of the flat settings of old
    with pytest.raises(ValidationError, match="api_host"):
        Settings(_env_file=None, **flat)
    with pytest.raises(ValidationError, match="hots"):
        Settings(_env_file=None, api=ApiSettings(hots="10.0.0.2"))  # type: ignore[call-arg]


def test_a_list_variable_that_is_not_json_is_refused_naming_it(clean_env):
    clean_env.setenv("CHAT_ALLOWED_ORIGINS", "https://a.example")
    with pytest.raises(Exception, match="CHAT_ALLOWED_ORIGINS"):
        Settings(_env_file=None)


def test_settings_field_reads_a_coded_default_by_its_path():
    assert Settings.field("api.body_max_chars").default == 4000
    assert Settings.field("log_level").default == "INFO"


def test_the_ferretdb_tail_waits_longer_while_idle_where_a_write_wakes_it(clean_env):
    """With Redis the writer's wake cuts an idle tail's wait short, so it may be long (each poll
    costs FerretDB a read of the whole oplog); without, it bounds the first message's delay."""
    assert Settings(_env_file=None).ferretdb_idle_poll_seconds() == 10.0  # Redis is on by default
    clean_env.setenv("CHAT_REDIS_URL", "")
    assert Settings(_env_file=None).ferretdb_idle_poll_seconds() == 2.0
    clean_env.setenv("CHAT_FERRETDB_TAIL_IDLE_POLL_MS", "500")  # set, it is kept either way
    assert Settings(_env_file=None).ferretdb_idle_poll_seconds() == 0.5


def test_a_writer_leads_every_partition_unless_told_which_and_a_bad_rule_is_refused_at_start(clean_env):
    assert Settings(_env_file=None).writer.led() is None  # one host, or no proxy leading writes: all
    clean_env.setenv("CHAT_WRITER_LEADS", "%3=1")  # also the partitions a grow adds
    assert Settings(_env_file=None).writer.led() == frozenset(range(1, 64, 3))
    clean_env.setenv("CHAT_WRITER_LEADS", "0, 2")
    assert Settings(_env_file=None).writer.led() == {0, 2}
    for bad in ("%3=3", "two", "64", "%0=0"):
        clean_env.setenv("CHAT_WRITER_LEADS", bad)
        with pytest.raises(ValidationError, match="leads"):
            Settings(_env_file=None)


def test_the_echo_watch_reads_at_least_once_a_second_and_never_without_a_pause(clean_env):
    # Unset, its period follows whether commits wake it through Redis (writer.echo_wake).
    assert Settings(_env_file=None).writer.echo_watch_ms is None
    assert Settings(_env_file=None).echo_watch_seconds() == 1.0  # Redis is there by default
    clean_env.setenv("CHAT_REDIS_URL", "")
    assert Settings(_env_file=None).echo_watch_seconds() == 0.05
    clean_env.setenv("CHAT_WRITER_ECHO_WATCH_MS", "200")
    assert Settings(_env_file=None).echo_watch_seconds() == 0.2
    for bad in ("0", "-5", "1001"):
        clean_env.setenv("CHAT_WRITER_ECHO_WATCH_MS", bad)
        with pytest.raises(ValidationError, match="echo_watch_ms"):
            Settings(_env_file=None)
