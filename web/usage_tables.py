"""The Usage page's tables, folded from hourly rows: one row per bucket for the chart, one per
bucket and model (or key) for the detail table and its CSV export.

Costs are exact sums of the ledger's pico-dollar costs. In $ the chart splits each bucket's cost by
category at the rates of the price version in force at each hour's start (the ledger keeps only a
request's total), so a category figure is exact unless a model's price changed within that hour.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction

from billing.money import format_usd_exact
from billing.pricebook import NoPriceError, PriceBook
from kvgate.usage import CATEGORY_LABELS, Category, TokenCounts
from web.formatting import ratio
from web.usage_source import HourRow, key_label
from web.usage_view import UsageView

CATEGORIES = tuple(Category)


WRITES = (Category.CACHE_WRITE_5M, Category.CACHE_WRITE_1H, Category.CACHE_WRITE_24H)


@dataclass(frozen=True)
class Priced:
    """An hour row's cost by category, and the plain input rate, at the price version in force."""

    category_cost_pico: dict[Category, int]
    input_rate_pico: int


@dataclass
class Sums:
    requests: int = 0
    counts: TokenCounts = field(default_factory=TokenCounts)
    cost_pico: int = 0
    uncached_cost_pico: int = 0
    category_cost_pico: dict[Category, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    reads_at_input_pico: int = 0
    """What the cache reads would have cost as plain input."""

    def add(self, row: HourRow, priced: Priced) -> None:
        self.requests += row.requests
        self.counts = self.counts + row.counts
        self.cost_pico += row.cost_pico
        self.uncached_cost_pico += row.uncached_cost_pico
        for category, pico in priced.category_cost_pico.items():
            self.category_cost_pico[category] += pico
        self.reads_at_input_pico += row.counts.cache_read * priced.input_rate_pico

    @property
    def write_cost_pico(self) -> int:
        return sum(self.category_cost_pico[c] for c in WRITES)

    @property
    def read_savings_pico(self) -> int:
        """Reads at the input rate, less what they cost."""
        return self.reads_at_input_pico - self.category_cost_pico[Category.CACHE_READ]

    @property
    def savings_pico(self) -> int:
        return self.uncached_cost_pico - self.cost_pico

    @property
    def hit_rate(self) -> Fraction | None:
        """read / (input + writes + read) exactly, None when there was no prompt."""
        return ratio(self.counts.cache_read, self.counts.prompt_tokens)

    def value(self, category: Category, unit: str) -> int:
        """A category's tokens, or its cost in pico-dollars."""
        return self.category_cost_pico[category] if unit == "usd" else getattr(self.counts, category.value)


@dataclass(frozen=True)
class DetailRow:
    bucket: str
    split: str
    sums: Sums


@dataclass(frozen=True)
class UsageTables:
    view: UsageView
    buckets: list[tuple[str, Sums]]
    """Every bucket of the range in order, empty ones included."""
    details: list[DetailRow]
    """Non-empty (bucket, model or key) cells, in bucket then split order."""
    total: Sums
    by_split: list[tuple[str, Sums]]
    """Each model (or key) over the whole range, in name order."""


def price(row: HourRow, prices: PriceBook) -> Priced:
    try:
        rates = prices.price_for(row.model, row.hour).rates
    except NoPriceError:
        return Priced({}, 0)
    # A category the version does not offer has no tokens either (the gateway refuses such requests).
    costs = {c: tokens * (getattr(rates, c.value) or 0) for c, tokens in row.counts.by_category().items()}
    return Priced(costs, rates.input)


def fold(rows: Iterable[HourRow], *, view: UsageView, prices: PriceBook, key_names: dict[str, str]) -> UsageTables:
    by_bucket: dict[datetime, Sums] = {start: Sums() for start in view.buckets()}
    by_cell: dict[tuple[datetime, str], Sums] = defaultdict(Sums)
    by_split: dict[str, Sums] = defaultdict(Sums)
    total = Sums()
    for row in rows:
        priced = price(row, prices)
        bucket = view.bucket_of(row.hour)
        split = row.model if view.split == "model" else key_label(row.api_key_id, key_names)
        for sums in (by_bucket.setdefault(bucket, Sums()), by_cell[(bucket, split)], by_split[split], total):
            sums.add(row, priced)
    return UsageTables(
        view=view,
        buckets=[(view.label(start), sums) for start, sums in sorted(by_bucket.items())],
        details=[DetailRow(view.label(b), split, sums) for (b, split), sums in sorted(by_cell.items())],
        total=total,
        by_split=sorted(by_split.items()),
    )


CSV_HEADER = (
    "bucket",
    "split",
    "requests",
    *(f"{c.value}_tokens" for c in CATEGORIES),
    "cost_usd",
    "uncached_cost_usd",
)


def detail_cells(row: DetailRow) -> list[str]:
    """A detail row's values as the CSV writes them (and as the page's table shows them, unformatted)."""
    counts = row.sums.counts
    return [
        row.bucket,
        row.split,
        str(row.sums.requests),
        *(str(getattr(counts, c.value)) for c in CATEGORIES),
        format_usd_exact(row.sums.cost_pico),
        format_usd_exact(row.sums.uncached_cost_pico),
    ]


def to_csv(tables: UsageTables) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([CSV_HEADER[0], tables.view.split, *CSV_HEADER[2:]])
    for row in tables.details:
        writer.writerow(detail_cells(row))
    return buffer.getvalue()


LABELS = {c: CATEGORY_LABELS[c] for c in CATEGORIES}
