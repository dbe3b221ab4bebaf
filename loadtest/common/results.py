"""Where the benchmarks' files go: the published figures (loadtest/results/,
which the docs cite; its README.md says which file holds what), the page whose
tables are generated from them, and the git-ignored folder that any run not
published writes."""

from __future__ import annotations

from harness.servers import ROOT

RESULTS = ROOT / "loadtest" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
UNPUBLISHED = ROOT / "var" / "bench"

