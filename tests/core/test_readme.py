import re
from pathlib import Path

from chat.settings import env_names, markdown_table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETTINGS_DOC = ROOT / "docs" / "settings.md"


def test_the_settings_page_s_table_matches_the_code():
    assert markdown_table() in SETTINGS_DOC.read_text()


def test_every_setting_the_readme_names_exists():
    named = set(re.findall(r"`(CHAT_[A-Z_]+)`", README.read_text()))
    known = env_names()
    assert named and named <= known, named - known


def test_readme_shows_the_two_commands():
    text = README.read_text()
    assert "make run" in text and "make test" in text


def test_readme_stays_a_manual_of_at_most_30_kb():
    assert len(README.read_bytes()) <= 30_000
