"""How the scenario sections of docs/benchmarks.md write a figure: in a table's cell or in
their sentences, one way for every section, so that their tables read alike."""

from __future__ import annotations


def figure(value: object) -> str:
    """A dash for a figure the run does not have, floats as short as they go, counts with
    thousands separators."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def p50_p99(figures: dict | None) -> str:
    """A latency's ``p50/p99``; a dash where nothing was measured (no figures, or none timed)."""
    return "–" if not figures or figures.get("p50") is None else f"{figure(figures['p50'])}/{figure(figures['p99'])}"


def times(ratio: float | None) -> str:
    """A ratio of two figures of one run: ``1.25×``."""
    return "–" if ratio is None else f"{ratio:.2f}×"
