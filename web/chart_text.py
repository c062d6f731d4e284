"""A chart in one sentence: what a reader without JavaScript (or a screen) learns before the table.

Each chart's numbers are in its table (collapsed by default); this sentence says what the chart would
show at a glance: the total and the busiest bucket for amounts, the lowest and highest for rates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

Point = tuple[str, Any]


def amount_summary(points: Sequence[Point], *, what: str, fmt: Callable[[int], str], bucket: str) -> str:
    """Amounts that add up (tokens, dollars): their total, in how many buckets, and the largest."""
    filled = [(label, int(value)) for label, value in points if value]
    if not filled:
        return f"No {what} in these {len(points)} {bucket}s."
    total = sum(value for _, value in filled)
    label, peak = max(filled, key=lambda p: p[1])
    if len(filled) == 1:
        return f"{fmt(total)} of {what}, all of it in one {bucket}: {label}."
    return f"{fmt(total)} of {what} in {len(filled)} of {len(points)} {bucket}s; the most in {label}: {fmt(peak)}."


def rate_summary(points: Sequence[Point], *, what: str, fmt: Callable[[Fraction], str], bucket: str) -> str:
    """Rates (a hit rate, None where nothing was cacheable): where known, their lowest and highest."""
    known = [(label, value) for label, value in points if value is not None]
    if not known:
        return f"No {what} in these {len(points)} {bucket}s: nothing was cacheable."
    low, high = min(known, key=lambda p: p[1]), max(known, key=lambda p: p[1])
    if len(known) == 1:
        return f"{what.capitalize()} known for one {bucket} only, {low[0]}: {fmt(low[1])}."
    return (
        f"{what.capitalize()} over {len(known)} {bucket}s: lowest {fmt(low[1])} ({low[0]}), "
        f"highest {fmt(high[1])} ({high[0]})."
    )
