"""Turning a month of ledger sums into invoice lines: the one place amounts are rounded.

Lines are per model x price version x category. Each line's exact amount is its
token count times the version's per-token rate (an exact integer of pico-dollars, equal
to the sum of the per-request costs); the line is then rounded half-even to the cent
once, and the subtotal is the sum of the rounded lines, so what a person adds up on
the page is what is charged. This is what Stripe does with invoice items (each line
rounded to the currency's minor unit, the total their sum). Tax is then computed on the
subtotal (billing.tax). The cache savings percentage comes from the exact amounts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from billing.money import round_to_cents
from billing.prices import PriceVersion
from kvgate.usage import CATEGORY_LABELS, Category, TokenCounts

_CATEGORY_ORDER = {c: i for i, c in enumerate(Category)}


@dataclass(frozen=True)
class UsageAggregate:
    """Summed token counts of one tenant's entries for one model under one price version."""

    model: str
    price_version_id: int
    counts: TokenCounts
    requests: int
    batch: bool = False  # batch requests' sums, priced at the version's batch rates


@dataclass(frozen=True)
class InvoiceLine:
    position: int
    model: str
    category: Category
    price_version_id: int
    tokens: int
    unit_price_usd_per_mtok: Decimal
    exact_amount_pico: int
    amount_cents: int
    batch: bool = False

    @property
    def description(self) -> str:
        return f"{self.model} — {CATEGORY_LABELS[self.category]}{' (batch)' if self.batch else ''}"


class CacheSavings:
    """What the prompt cache saved: the uncached price less the total, in cents and in percent (to 0.1).

    The percentage comes from the exact pico-dollar amounts where the subclass knows them (rounding
    each side to cents first can move it by many points on a small invoice)."""

    total_cents: int
    uncached_cents: int
    exact_total_pico: int | None
    exact_uncached_pico: int | None

    @property
    def savings_cents(self) -> int:
        return self.uncached_cents - self.total_cents

    @property
    def savings_percent(self) -> Decimal:
        exact_total, exact_uncached = self.exact_total_pico, self.exact_uncached_pico
        if exact_total is not None and exact_uncached is not None:
            saved, base = exact_uncached - exact_total, exact_uncached
        else:
            saved, base = self.savings_cents, self.uncached_cents
        if base <= 0:
            return Decimal(0)
        return (Decimal(100) * saved / base).quantize(Decimal("0.1"), rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True)
class InvoiceComputation(CacheSavings):
    lines: tuple[InvoiceLine, ...]
    requests: int
    total_cents: int
    exact_total_pico: int
    uncached_cents: int
    """The same usage priced with no prompt cache, rounded per model and version like the lines."""
    exact_uncached_pico: int | None = None


def compute_invoice(*, aggregates: Iterable[UsageAggregate], versions: dict[int, PriceVersion]) -> InvoiceComputation:
    """Build the lines for one tenant-month; `versions` must hold every aggregate's price version."""
    rows = sorted(aggregates, key=lambda a: (a.model, versions[a.price_version_id].effective_from, a.batch))
    lines: list[InvoiceLine] = []
    uncached_cents = 0
    exact_uncached = 0
    requests = 0
    for aggregate in rows:
        version = versions[aggregate.price_version_id]
        requests += aggregate.requests
        rates = version.rates_for(batch=aggregate.batch)
        uncached = version.uncached_cost_pico(aggregate.counts, batch=aggregate.batch)
        exact_uncached += uncached
        uncached_cents += round_to_cents(uncached)
        by_category = sorted(aggregate.counts.by_category().items(), key=lambda kv: _CATEGORY_ORDER[kv[0]])
        for category, tokens in by_category:
            if tokens == 0:
                continue
            exact = tokens * rates.for_category(category)
            lines.append(
                InvoiceLine(
                    position=len(lines) + 1,
                    model=aggregate.model,
                    category=category,
                    price_version_id=version.id,
                    tokens=tokens,
                    unit_price_usd_per_mtok=Decimal(rates.for_category(category)).scaleb(-6).normalize(),
                    exact_amount_pico=exact,
                    amount_cents=round_to_cents(exact),
                    batch=aggregate.batch,
                )
            )
    return InvoiceComputation(
        lines=tuple(lines),
        requests=requests,
        total_cents=sum(line.amount_cents for line in lines),
        exact_total_pico=sum(line.exact_amount_pico for line in lines),
        uncached_cents=uncached_cents,
        exact_uncached_pico=exact_uncached,
    )
