"""Usage as CSV: one row per ledger entry, amounts exact (never rounded) so the export re-adds; and an invoice's
lines as CSV (`kvgate invoices csv N`), with both the exact and the rounded amount of each line."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from datetime import date, datetime
from typing import Any

from billing.invoice_lines import InvoiceLine
from billing.money import cents_to_usd, format_usd_exact
from kvgate.usage import CATEGORY_LABELS, Category

CSV_COLUMNS = (
    "request_id",
    "kind",
    "tenant_id",
    "api_key_id",
    "model",
    "endpoint",
    "status",
    "started_at",
    "billing_month",
    "price_version_id",
    # Token columns in the one category order (input, each TTL class's writes by lifetime, read, output).
    *(f"{category.value}_tokens" for category in Category),
    "cost_usd",
    "uncached_cost_usd",
    "ttft_ms",
    "latency_ms",
)


@dataclass(frozen=True)
class UsageRow:
    """One ledger entry as the usage API, the CLI and the CSV export show it."""

    id: int
    request_id: str
    kind: str
    tenant_id: str
    api_key_id: str | None
    model: str
    endpoint: str
    status: str
    started_at: datetime
    billing_month: date
    price_version_id: int
    input_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    cache_write_24h_tokens: int
    cache_write_30m_tokens: int
    cache_write_12h_tokens: int
    cache_read_tokens: int
    output_tokens: int
    cost_pico: int
    uncached_cost_pico: int
    ttft_ms: int | None
    latency_ms: int | None

    def shown(self) -> dict[str, Any]:
        """Every field, plus the month as YYYY-MM and the amounts as exact USD (cost_usd, uncached_cost_usd)."""
        return {
            **{f.name: getattr(self, f.name) for f in fields(self)},
            "billing_month": self.billing_month.strftime("%Y-%m"),
            "cost_usd": format_usd_exact(self.cost_pico),
            "uncached_cost_usd": format_usd_exact(self.uncached_cost_pico),
        }

    def csv_values(self) -> list[str]:
        values = {**self.shown(), "started_at": self.started_at.isoformat()}
        return ["" if values[c] is None else str(values[c]) for c in CSV_COLUMNS]


def iter_csv(rows: Iterable[UsageRow]) -> Iterator[str]:
    """CSV text in chunks, header first, so a large export streams."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow(row.csv_values())
        if buffer.tell() > 64 * 1024:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


INVOICE_LINE_COLUMNS = (
    "invoice",
    "position",
    "model",
    "category",
    "description",
    "price_version_id",
    "tokens",
    "unit_price_usd_per_mtok",
    "exact_amount_usd",
    "amount_usd",
)


def invoice_lines_csv(*, invoice: str, lines: Iterable[InvoiceLine]) -> str:
    """One row per invoice line: tokens, unit price, the exact amount and the amount charged (rounded once)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(INVOICE_LINE_COLUMNS)
    for line in lines:
        writer.writerow(
            [
                invoice,
                line.position,
                line.model,
                line.category.value,
                CATEGORY_LABELS[line.category],
                line.price_version_id,
                line.tokens,
                str(line.unit_price_usd_per_mtok),
                format_usd_exact(line.exact_amount_pico),
                str(cents_to_usd(line.amount_cents)),
            ]
        )
    return buffer.getvalue()
