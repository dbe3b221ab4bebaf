"""Where the web page is told to find the daemons (GET /v1/client-config). Pure."""

from api.app import daemon_urls


def test_default_is_the_pages_host_on_the_daemon_port():
    assert daemon_urls("", "http", "127.0.0.1", 8100) == {
        "ws_url": "ws://127.0.0.1:8100/v1/ws", "poll_url": "http://127.0.0.1:8100/v1/poll"}


def test_https_page_gets_wss_and_ipv6_hosts_are_bracketed():
    assert daemon_urls("", "https", "::1", 8100) == {
        "ws_url": "wss://[::1]:8100/v1/ws", "poll_url": "https://[::1]:8100/v1/poll"}


def test_public_daemon_url_wins_as_production_sets_it():
    assert daemon_urls("https://chat.example.com/", "http", "10.0.0.5", 8100) == {
        "ws_url": "wss://chat.example.com/v1/ws", "poll_url": "https://chat.example.com/v1/poll"}
