"""An invoice's VAT also in EUR (Art. 230 of the VAT Directive), fixed at finalization.

Due when the seller's address is in an EU member state, the invoice charges VAT, and its currency is not
EUR. Each tax line's amount is converted at the operator's rate dated on or before the issue date
(billing/exchange_rates.py), half-even to the euro cent; the total is the sum of the converted lines.
The rate, its date and its source are stored with the invoice (`invoices.vat_eur_json`) and printed with
the amounts, so the issued document never depends on the table again. With no rate loaded for that
currency and date, finalization is refused (409), naming the rate to load: an invoice lacking this
particular must not be issued.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from billing.exchange_rates import rate_on
from billing.profiles import BillingProfile
from billing.tax import TaxLine
from billing.tax_rules import EU_COUNTRIES
from kvgate.errors import ConflictError


class MissingExchangeRateError(ConflictError):
    """Finalizing needs an EUR rate that the operator has not loaded."""


@dataclass(frozen=True)
class EurTaxLine:
    label: str
    eur_cents: int


@dataclass(frozen=True)
class VatInEur:
    currency: str
    eur_per_unit: Decimal
    rate_date: date
    source: str
    lines: tuple[EurTaxLine, ...]

    @property
    def total_eur_cents(self) -> int:
        return sum(line.eur_cents for line in self.lines)

    def to_json(self) -> str:
        return json.dumps(
            {
                "currency": self.currency,
                "eur_per_unit": str(self.eur_per_unit),
                "rate_date": self.rate_date.isoformat(),
                "source": self.source,
                "lines": [{"label": line.label, "eur_cents": line.eur_cents} for line in self.lines],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> VatInEur:
        data = json.loads(text)
        return cls(
            currency=data["currency"],
            eur_per_unit=Decimal(data["eur_per_unit"]),
            rate_date=date.fromisoformat(data["rate_date"]),
            source=data["source"],
            lines=tuple(EurTaxLine(line["label"], int(line["eur_cents"])) for line in data["lines"]),
        )


def eur_cents(cents: int, eur_per_unit: Decimal) -> int:
    return int((Decimal(cents) * eur_per_unit).to_integral_value(rounding=ROUND_HALF_EVEN))


def needs_eur(*, seller: BillingProfile | None, currency: str, taxes: Sequence[TaxLine]) -> bool:
    country = seller.address.country if seller and seller.address else None
    return country in EU_COUNTRIES and currency.lower() != "eur" and any(t.amount_cents for t in taxes)


async def vat_in_eur(
    session: AsyncSession, *, seller: BillingProfile | None, currency: str, taxes: Sequence[TaxLine], issued: date
) -> VatInEur | None:
    """The invoice's VAT in EUR at the rate in force on `issued`; None where none is due."""
    if not needs_eur(seller=seller, currency=currency, taxes=taxes):
        return None
    rate = await rate_on(session, currency=currency, on=issued)
    if rate is None:
        code = currency.upper()
        raise MissingExchangeRateError(
            f"this invoice charges VAT in {code} from an EU seller, so it must state the VAT in EUR too (Art. 230 "
            f"VAT Directive); no {code} rate is loaded for {issued.isoformat()} or before: load one with "
            f"`kvgate exchange-rates set {code} {issued.isoformat()} <EUR per {code}> --source ...` or "
            f"PUT /admin/v1/exchange-rates/{code}/{issued.isoformat()}"
        )
    per_unit = Decimal(rate.eur_per_unit)
    lines = tuple(EurTaxLine(t.label, eur_cents(t.amount_cents, per_unit)) for t in taxes if t.amount_cents)
    return VatInEur(currency, per_unit, rate.rate_date, rate.source, lines)
