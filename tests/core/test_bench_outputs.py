"""`make bench` leaves the published figures alone: every file a run that is
not a publishing one would write is ignored by git, and none is tracked. The
paths are computed as loadtest.bench computes them; no benchmark runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.servers import ROOT
from loadtest.bench import outputs
from loadtest.common.results import DOCS, RESULTS


def ignored_by_git(paths: list[Path]) -> set[Path]:
    answer = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *map(str, paths)],
                            capture_output=True, text=True, check=False)
    return {Path(line) for line in answer.stdout.splitlines()}


def tracked_by_git(paths: list[Path]) -> set[Path]:
    answer = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--full-name", *map(str, paths)],
                            capture_output=True, text=True, check=True)
    return {ROOT / line for line in answer.stdout.splitlines()}


@pytest.mark.parametrize("full", [False, True], ids=["make bench", "--full without --publish"])
def test_a_run_that_does_not_publish_writes_only_files_git_ignores(full: bool) -> None:
    files = outputs(full=full, publish=False).files()
    assert files and DOCS not in files
    assert ignored_by_git(files) == set(files)
    assert not tracked_by_git(files)


def test_a_publishing_run_rewrites_the_published_figures_and_the_page() -> None:
    published = outputs(full=True, publish=True)
    assert published.docs == DOCS
    assert all(path.parent == RESULTS for path in published.files() if path != DOCS)
    assert {RESULTS / "latest.json", RESULTS / "peers-latest.json"} <= tracked_by_git(published.files())
