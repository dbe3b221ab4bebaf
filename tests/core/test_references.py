"""Every pointer in the project lands somewhere: a `docs/...` path named in
code, configuration or docs exists, a Markdown link to a file of the project
resolves, and a reference to the README by section names one of its headings."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Result data quotes paths as they were when it was measured; it is not read as
# prose. This file names missing pages on purpose, to test the check.
NOT_PROSE = ("loadtest/results/", "tests/core/test_references.py")
TEXT = (".py", ".md", ".js", ".sh", ".conf", ".toml", ".cnf", ".sql", ".html", ".ini", "Makefile")
DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*\w")
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
README_SECTION = re.compile(r"README(?:'s|,)? (?:section )?[\"“]([^\"”]+)[\"”]")


def tracked_texts() -> dict[str, str]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {name: (ROOT / name).read_text(errors="replace") for name in names
            if name.endswith(TEXT) and not name.startswith(NOT_PROSE) and (ROOT / name).is_file()}


def readme_headings() -> list[str]:
    return [line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("#")]


def dangling(texts: dict[str, str], headings: list[str], exists) -> list[str]:
    found = []
    for name, text in texts.items():
        for path in DOCS_PATH.findall(text):
            if not exists(path):
                found.append(f"{name}: {path}")
        if name.endswith(".md"):
            for target in MARKDOWN_LINK.findall(text):
                if "://" in target or target.startswith("mailto:"):
                    continue
                if not exists(str(Path(name).parent / target)):
                    found.append(f"{name}: link {target}")
        for section in README_SECTION.findall(text):
            if not any(h.lower().startswith(section.lower()) for h in headings):
                found.append(f'{name}: README "{section}"')
    return found


def exists_in_project(path: str) -> bool:
    return (ROOT / path).resolve().exists()


def test_every_docs_path_link_and_readme_section_named_in_the_project_exists():
    assert dangling(tracked_texts(), readme_headings(), exists_in_project) == []


def test_the_check_finds_a_missing_page_a_broken_link_and_an_unknown_section():
    texts = {"daemon/x.py": 'see docs/gone.md and docs/design.md (README, "Nowhere"), README "Limits"',
             "docs/a.md": "[ok](design.md) [bad](decisions/gone.md) [web](https://example.org/x.md)"}
    found = dangling(texts, ["Limits", "Settings"], lambda p: p in {"docs/design.md"})
    assert found == ["daemon/x.py: docs/gone.md", 'daemon/x.py: README "Nowhere"',
                     "docs/a.md: link decisions/gone.md"]
