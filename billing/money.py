"""Money in billing: integer pico-dollars (1e-12 USD) everywhere, cents only on invoice lines.

Why pico: a price catalog entry is USD per million tokens with at most four decimals
and multipliers are multiples of 0.05, so every per-token rate is a whole number of
pico-dollars and a request's cost is an exact integer sum. Floats never appear.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from billing.errors import BillingDomainError

PICO_PER_USD = 10**12
PICO_PER_CENT = 10**10
TOKENS_PER_MTOK = 10**6
# Rates are per token; a USD-per-Mtok price becomes this many pico-dollars per token per USD.
PICO_PER_TOKEN_PER_USD_PER_MTOK = PICO_PER_USD // TOKENS_PER_MTOK


# Amounts are stored as 64-bit pico-dollars, which top out at $9,223,372.036854775807. Money
# people enter (a credit grant, a budget limit, a tenant's total granted credit) is capped a
# little below, so that a limit plus the requests checked against it never overflows.
MAX_AMOUNT_PICO = 9_000_000 * PICO_PER_USD


class MoneyError(BillingDomainError, ValueError):
    """An amount that cannot be represented exactly, or not stored."""


def parse_usd(value: str, *, field: str, cents: bool = False) -> int:
    """An amount a person entered, in pico-dollars (or cents); an error names the field."""
    try:
        return usd_to_cents(value) if cents else usd_to_pico(value)
    except MoneyError as exc:
        raise MoneyError(f"{field}: {exc}", field=field) from exc


def pico_to_usd(pico: int) -> Decimal:
    """Exact USD value of an integer amount of pico-dollars."""
    return Decimal(pico).scaleb(-12)


def usd_to_pico(usd: Decimal | str | int) -> int:
    """Parse an amount people enter into pico-dollars: exact (never rounded) and storable
    (at most MAX_AMOUNT_PICO in size)."""
    pico = _parse_pico(usd)
    if abs(pico) > MAX_AMOUNT_PICO:
        limit = format_usd(MAX_AMOUNT_PICO // PICO_PER_CENT)
        raise MoneyError(f"{usd} USD is more than the largest amount kvgate stores ({limit})")
    return pico


def _parse_pico(usd: Decimal | str | int) -> int:
    try:
        value = Decimal(usd) if not isinstance(usd, Decimal) else usd
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise MoneyError(f"not a decimal amount: {usd!r}") from exc
    if not value.is_finite():
        raise MoneyError(f"not a finite amount: {usd!r}")
    if value and value.adjusted() > 18:  # checked before int(), which would build every digit of 1e999999
        raise MoneyError(f"{usd} USD is not a plausible amount")
    pico = value.scaleb(12)
    if pico != pico.to_integral_value():
        raise MoneyError(f"{usd} USD is finer than a pico-dollar")
    return int(pico)


def cents_to_usd(cents: int) -> Decimal:
    return Decimal(cents).scaleb(-2)


def usd_to_cents(usd: Decimal | str | int) -> int:
    """Parse a USD amount given to the cent (credit notes)."""
    pico = _parse_pico(usd)
    if pico % PICO_PER_CENT:
        raise MoneyError(f"{usd} USD is not a whole number of cents")
    return pico // PICO_PER_CENT


def round_to_cents(pico: int) -> int:
    """Half-even rounding to the cent: the only rounding in billing, done on invoice lines."""
    return int(Decimal(pico).scaleb(-10).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def format_usd(cents: int) -> str:
    """'$1,234.56' (and '-$0.50') for documents people read."""
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(cents), 100)
    return f"{sign}${whole:,}.{part:02d}"


def format_usd_exact(pico: int) -> str:
    """The exact amount with trailing zeros dropped, e.g. '0.000123' (for headers and usage)."""
    value = pico_to_usd(pico)
    text = format(value.normalize(), "f") if value else "0"
    return text
