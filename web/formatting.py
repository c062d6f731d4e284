"""How the dashboard writes numbers: exact dollars from pico-dollars, invoice dollars from cents, tokens, rates."""

from __future__ import annotations

from jinja2 import Environment

from billing.money import format_usd, format_usd_exact


def usd_exact(pico: int) -> str:
    """'$0.000123' (every digit the ledger has, never rounded); '-$0.5' for negatives."""
    sign = "-" if pico < 0 else ""
    return f"{sign}${format_usd_exact(abs(pico))}"


def tokens(count: int) -> str:
    return f"{count:,}"


def percent(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio * 100:.1f}%"


def install_filters(env: Environment) -> None:
    env.filters.update(usd_exact=usd_exact, usd=format_usd, tokens=tokens, percent=percent)
