from pathlib import Path

from chat.settings import markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_settings_table_matches_the_code():
    assert markdown_table() in README.read_text()


def test_readme_shows_the_two_commands():
    text = README.read_text()
    assert "make run" in text and "make test" in text


def test_readme_stays_a_manual_of_at_most_30_kb():
    assert len(README.read_bytes()) <= 30_000
