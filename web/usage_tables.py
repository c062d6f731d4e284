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
from kvgate.usage import CATEGORY_LABELS, TTL_CLASSES, Category, TokenCounts
from web.formatting import ratio
from web.usage_source import HourRow, key_label
from web.usage_view import UsageView

CATEGORIES = tuple(Category)
# (category, its field name): Enum's .value is slow, and a month's fold reads it tens of thousands of times.
_FIELDS = tuple((c, c.value) for c in CATEGORIES)


# Every TTL class's writes, from the one table (kvgate.usage): a view never lists them by hand.
WRITES = tuple(t.category for t in TTL_CLASSES)


@dataclass(frozen=True)
class Priced:
    """An hour row's cost by category, and the plain input rate, at the price version in force."""

    category_cost_pico: dict[Category, int]
    input_rate_pico: int


@dataclass
class Sums:
    requests: int = 0
    tokens: list[int] = field(default_factory=lambda: [0] * len(CATEGORIES))
    """Token counts in CATEGORIES order: plain ints, as a month folds thousands of hour rows."""
    cost_pico: int = 0
    uncached_cost_pico: int = 0
    category_cost_pico: dict[Category, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    reads_at_input_pico: int = 0
    """What the cache reads would have cost as plain input."""

    @property
    def counts(self) -> TokenCounts:
        return TokenCounts(*self.tokens)

    def add(self, row: HourRow, priced: Priced) -> None:
        self.requests += row.requests
        for index, (_, name) in enumerate(_FIELDS):
            self.tokens[index] += getattr(row.counts, name)
        self.cost_pico += row.cost_pico
        self.uncached_cost_pico += row.uncached_cost_pico
        for category, pico in priced.category_cost_pico.items():
            self.category_cost_pico[category] += pico
        self.reads_at_input_pico += row.counts.cache_read * priced.input_rate_pico

    def merge(self, other: Sums) -> None:
        """Add another sum (of other rows) to this one."""
        self.requests += other.requests
        self.tokens = [mine + theirs for mine, theirs in zip(self.tokens, other.tokens, strict=True)]
        self.cost_pico += other.cost_pico
        self.uncached_cost_pico += other.uncached_cost_pico
        for category, pico in other.category_cost_pico.items():
            self.category_cost_pico[category] += pico
        self.reads_at_input_pico += other.reads_at_input_pico

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
        return self.category_cost_pico[category] if unit == "usd" else self.tokens[CATEGORIES.index(category)]


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
    split_buckets: list[tuple[str, list[Sums]]]
    """Every bucket's sums per model (or key), in by_split's order: the split chart."""


def price(row: HourRow, prices: PriceBook) -> Priced:
    try:
        rates = prices.price_for(row.model, row.hour).rates
    except NoPriceError:
        return Priced({}, 0)
    # A category the version does not offer has no tokens either (the gateway refuses such requests).
    costs = {c: getattr(row.counts, name) * (getattr(rates, name) or 0) for c, name in _FIELDS}
    return Priced(costs, rates.input)


def fold(rows: Iterable[HourRow], *, view: UsageView, prices: PriceBook, key_names: dict[str, str]) -> UsageTables:
    by_cell: dict[tuple[datetime, str], Sums] = defaultdict(Sums)
    for row in rows:
        split = row.model if view.split == "model" else key_label(row.api_key_id, key_names)
        by_cell[(view.bucket_of(row.hour), split)].add(row, price(row, prices))
    # Buckets, splits and the total are sums of the cells (a month: hundreds), not of every hour row
    # again (a month by model and key: thousands, each a TokenCounts addition).
    by_bucket: dict[datetime, Sums] = {start: Sums() for start in view.buckets()}
    by_split: dict[str, Sums] = defaultdict(Sums)
    total = Sums()
    for (bucket, split), cell in by_cell.items():
        for sums in (by_bucket.setdefault(bucket, Sums()), by_split[split], total):
            sums.merge(cell)
    splits = sorted(by_split)
    empty = Sums()
    return UsageTables(
        view=view,
        buckets=[(view.label(start), sums) for start, sums in sorted(by_bucket.items())],
        details=[DetailRow(view.label(b), split, sums) for (b, split), sums in sorted(by_cell.items())],
        total=total,
        by_split=sorted(by_split.items()),
        split_buckets=[
            (view.label(start), [by_cell.get((start, split), empty) for split in splits]) for start in sorted(by_bucket)
        ],
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
