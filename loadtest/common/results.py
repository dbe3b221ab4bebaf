"""Where the benchmarks' files go: the published figures (loadtest/results/,
which the docs cite; its README.md says which file holds what), the page whose
tables are generated from them, and the git-ignored folder that any run not
published writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from harness.servers import ROOT

RESULTS = ROOT / "loadtest" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
UNPUBLISHED = ROOT / "var" / "bench"


def write_result(result: dict, target: Path, table: Callable[[dict], list[str]], publish: bool, name: str) -> None:
    """A scenario's end: its JSON written to ``target``, its table printed, the page's
    generated tables rewritten if it is published, and a failing exit if its own checks failed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    print("\n".join(table(result)))
    print(f"\nwrote {target}")
    if publish:
        from loadtest.report.write import rewrite_generated

        rewrite_generated()
        print("rewrote the generated tables of docs/benchmarks.md")
    if result["failed"]:
        raise SystemExit(f"FAILED {name}: {result['failed']}")


def per_unit_us(cpu_seconds: float, count: int) -> float | None:
    """CPU seconds spent on ``count`` units, in microseconds each (None for none)."""
    return round(cpu_seconds / count * 1e6, 1) if count else None


def ratio(value: float | None, base: float | None) -> float | None:
    """``value`` against ``base`` of the same run, to two places (None where either is missing)."""
    return round(value / base, 2) if value is not None and base else None
