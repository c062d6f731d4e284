"""How the dashboard writes numbers: exact dollars from pico-dollars, percentages from exact ratios."""

from __future__ import annotations

from datetime import datetime
from fractions import Fraction

from billing.money import format_usd, format_usd_exact, round_to_cents


def usd(pico: int) -> str:
    """'$0.000123', '$12.5', '-$0.01': the exact amount, as on the invoice's usage lines."""
    text = format_usd_exact(abs(pico))
    whole, dot, part = text.partition(".")
    return f"{'-' if pico < 0 else ''}${int(whole):,}{dot}{part}"


def ratio(part: int, whole: int) -> Fraction | None:
    """part / whole exactly, or None when whole is 0 (no rate to show)."""
    return Fraction(part, whole) if whole else None


def percent(value: Fraction | None, places: int = 1) -> str:
    """'73.4%' (rounded half-even at `places`), or an em dash when there is nothing to divide by."""
    if value is None:
        return "—"
    scaled = round(value * 100 * 10**places)
    return f"{scaled / 10**places:.{places}f}%"


def when(moment: datetime | None) -> str:
    """'2026-03-01 14:05 UTC', or 'never'."""
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "never"


def integer(value: int) -> str:
    return f"{value:,}"


def usd_rounded(pico: int) -> str:
    """'$3.10': to the cent, for estimates (an exact '$3.099479696115' claims a precision a forecast lacks)."""
    return format_usd(round_to_cents(pico))


FILTERS = {
    "usd": usd,
    "cents": format_usd,
    "usd_rounded": usd_rounded,
    "percent": percent,
    "when": when,
    "integer": integer,
}
