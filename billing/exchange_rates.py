"""The operator's table of exchange rates into EUR, dated: what an invoice's VAT in EUR is converted at.

Art. 230 of the VAT Directive: an invoice in another currency states the VAT in the member state's
currency, converted at the rate of Art. 91 (the latest ECB rate, or the member state's published rate,
on the day VAT becomes chargeable). kvgate fetches nothing: the operator loads each rate it will use
(`kvgate exchange-rates set`, `PUT /admin/v1/exchange-rates/{currency}/{date}`), with its source, and
finalization takes the latest one dated on or before the invoice's issue date (billing/vat_in_eur.py).
A rate once loaded for a date can be corrected until an invoice uses it; invoices keep the rate they
were issued with, whatever the table says later.
"""

from __future__ import annotations

import re
from datetime import date
from decimal import Decimal, InvalidOperation

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from billing.models import ExchangeRate
from kvgate.db import utcnow
from kvgate.errors import InvalidRequestError

CURRENCY = re.compile(r"^[a-z]{3}$")
MAX_RATE = Decimal(1_000_000)


def parse_currency(text: str) -> str:
    currency = text.strip().lower()
    if not CURRENCY.match(currency) or currency == "eur":
        raise InvalidRequestError("currency: an ISO 4217 code other than EUR, e.g. USD", param="currency")
    return currency


def parse_rate(text: str) -> Decimal:
    """EUR per one unit of the currency: a plain positive decimal, at most 10 places."""
    try:
        rate = Decimal(text.strip())
    except (InvalidOperation, AttributeError):
        raise InvalidRequestError("eur_per_unit: a decimal number, e.g. 0.9234", param="eur_per_unit") from None
    if not rate.is_finite() or rate <= 0 or rate >= MAX_RATE or -rate.as_tuple().exponent > 10:  # type: ignore[operator]
        raise InvalidRequestError(
            "eur_per_unit: a positive number below 1,000,000 with at most 10 decimal places", param="eur_per_unit"
        )
    return rate


async def set_rate(
    session: AsyncSession, *, currency: str, on: date, eur_per_unit: Decimal, source: str
) -> ExchangeRate:
    """Load (or correct) the rate of `currency` on `on`. Caller commits."""
    source = source.strip()
    if not source or len(source) > 200 or any(ord(c) < 0x20 for c in source):
        raise InvalidRequestError("source: who published the rate, 1 to 200 printable characters", param="source")
    row = await session.get(ExchangeRate, (currency, on))
    if row is None:
        row = ExchangeRate(currency=currency, rate_date=on)
        session.add(row)
    row.eur_per_unit, row.source, row.loaded_at = str(eur_per_unit), source, utcnow()
    await session.flush()
    return row


async def list_rates(session: AsyncSession, *, currency: str | None = None, limit: int = 100) -> list[ExchangeRate]:
    query = select(ExchangeRate).order_by(ExchangeRate.rate_date.desc(), ExchangeRate.currency).limit(limit)
    if currency is not None:
        query = query.where(ExchangeRate.currency == currency)
    return list((await session.scalars(query)).all())


async def rate_on(session: AsyncSession, *, currency: str, on: date) -> ExchangeRate | None:
    """The latest rate of `currency` dated on or before `on`."""
    query = (
        select(ExchangeRate)
        .where(ExchangeRate.currency == currency.lower(), ExchangeRate.rate_date <= on)
        .order_by(ExchangeRate.rate_date.desc())
        .limit(1)
    )
    return await session.scalar(query)
