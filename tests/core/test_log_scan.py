from pathlib import Path

from chat import auth
from loadtest.common.log_scan import tokens_in, tokens_in_logs

SECRET = "s" * 40


def test_a_token_in_an_nginx_error_line_is_found_and_a_stripped_one_is_not():
    token = auth.mint(SECRET, "bob")
    line = (f'2026/11/26 05:00:00 [error] 12#12: *3 connect() failed (111) while connecting to upstream, '
            f'request: "GET /v1/ws?token={token}&partition=0 HTTP/1.1", upstream: "http://10.0.0.2:8100/v1/ws"')
    assert tokens_in(line.encode()) == 1
    assert tokens_in(b'request: "GET /v1/ws?partition=0&since=1.0.42 HTTP/1.1"') == 0
    assert tokens_in(f"Authorization: Bearer {token}\n{token}".encode()) == 2


def test_every_file_under_the_folder_is_scanned(tmp_path: Path):
    (tmp_path / "h1" / "log").mkdir(parents=True)
    (tmp_path / "h1" / "log" / "daemon.log").write_text(f"event=x token={auth.mint(SECRET, 'a')}\n")
    (tmp_path / "nginx-error.log").write_text("nothing here\n")
    (tmp_path / "secret").write_text(SECRET)
    assert tokens_in_logs(tmp_path) == {"h1/log/daemon.log": 1}
