"""Figures a benchmark derives from what it measured, the same way in every scenario."""

from __future__ import annotations


def per_unit_us(cpu_seconds: float, count: int) -> float | None:
    """CPU seconds spent on ``count`` units, in microseconds each (None for none)."""
    return round(cpu_seconds / count * 1e6, 1) if count else None


def ratio(value: float | None, base: float | None) -> float | None:
    """``value`` against ``base`` of the same run, to two places (None where either is missing)."""
    return round(value / base, 2) if value is not None and base else None
