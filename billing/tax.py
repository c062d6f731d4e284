"""Tax on an invoice: one line per rate, computed on the subtotal (the sum of the rounded lines).

kvgate computes tax itself from the buyer's profile: `standard` charges its rate on the subtotal,
rounded half-even to the cent once; `reverse_charge` and `exempt` charge none and carry a legal
note instead. Everything downstream (documents, amount due, Stripe) reads `TaxLine`s, so a
provider (Stripe Tax) can later supply the lines instead of `tax_lines` without changing them.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from billing.profiles import TaxTreatment


@dataclass(frozen=True)
class TaxLine:
    label: str
    rate_percent: Decimal
    taxable_cents: int
    amount_cents: int


def percent_text(rate: Decimal) -> str:
    """19 -> '19', 7.70 -> '7.7'."""
    text = format(rate.normalize(), "f")
    return text


def tax_lines(*, subtotal_cents: int, treatment: TaxTreatment) -> tuple[TaxLine, ...]:
    """The tax lines of an invoice with this subtotal: none unless the treatment is standard."""
    if treatment.treatment != "standard" or treatment.rate_percent is None:
        return ()
    rate = treatment.rate_percent
    amount = int((Decimal(subtotal_cents) * rate / 100).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    label = f"VAT {percent_text(rate)}%"
    return (TaxLine(label=label, rate_percent=rate, taxable_cents=subtotal_cents, amount_cents=amount),)
