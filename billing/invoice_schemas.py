"""Invoices' and credit notes' wire shapes, shared by the admin API, the tenant API and the CLI."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from billing.invoices import InvoiceView
from billing.models import CreditNote
from billing.money import format_usd_exact
from billing.schemas import StrictBody, UsdAmount, cents_text


class LineOut(BaseModel):
    position: int
    model: str
    category: str
    tokens: int
    unit_price_usd_per_mtok: str
    amount_usd: str
    exact_amount_usd: str
    price_version_id: int


class CreditNoteOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    invoice_id: int
    number: str
    amount_usd: str
    reason: str
    created_at: datetime

    @classmethod
    def of(cls, note: CreditNote) -> CreditNoteOut:
        return cls(
            id=note.id,
            invoice_id=note.invoice_id,
            number=note.number,
            amount_usd=cents_text(note.amount_cents),
            reason=note.reason,
            created_at=note.created_at,
        )


class CreditNoteIn(StrictBody):
    amount_usd: UsdAmount
    reason: str = Field(min_length=1, max_length=500)


class CreditNoteList(BaseModel):
    data: list[CreditNoteOut]


class InvoiceOut(BaseModel):
    id: int
    tenant_id: str
    month: str
    status: str
    number: str | None
    currency: str
    requests: int
    subtotal_usd: str
    tax_usd: str
    total_usd: str
    exact_usage_usd: str
    uncached_usd: str
    savings_usd: str
    savings_percent: str
    credited_usd: str
    amount_due_usd: str
    created_at: datetime
    finalized_at: datetime | None
    due_on: str | None = None
    paid_at: datetime | None
    stripe_invoice_id: str | None
    lines: list[LineOut] | None = None
    credit_notes: list[CreditNoteOut] | None = None

    @classmethod
    def of(cls, view: InvoiceView, *, detail: bool) -> InvoiceOut:
        """An invoice; with `detail`, its lines and credit notes too."""
        inv, comp = view.invoice, view.computation
        return cls(
            id=inv.id,
            tenant_id=inv.tenant_id,
            month=inv.period_start.strftime("%Y-%m"),
            status=inv.status,
            number=inv.number,
            currency=inv.currency,
            requests=comp.requests,
            subtotal_usd=cents_text(view.subtotal_cents),
            tax_usd=cents_text(view.tax_cents),
            total_usd=cents_text(view.total_cents),
            exact_usage_usd=format_usd_exact(comp.exact_total_pico),
            uncached_usd=cents_text(comp.uncached_cents),
            savings_usd=cents_text(comp.savings_cents),
            savings_percent=str(comp.savings_percent),
            credited_usd=cents_text(view.credited_cents),
            amount_due_usd=cents_text(view.amount_due_cents),
            created_at=inv.created_at,
            finalized_at=inv.finalized_at,
            due_on=inv.due_on.isoformat() if inv.due_on else None,
            paid_at=inv.paid_at,
            stripe_invoice_id=inv.stripe_invoice_id,
            lines=[
                LineOut(
                    position=line.position,
                    model=line.model,
                    category=line.category.value,
                    tokens=line.tokens,
                    unit_price_usd_per_mtok=str(line.unit_price_usd_per_mtok),
                    amount_usd=cents_text(line.amount_cents),
                    exact_amount_usd=format_usd_exact(line.exact_amount_pico),
                    price_version_id=line.price_version_id,
                )
                for line in comp.lines
            ]
            if detail
            else None,
            credit_notes=[CreditNoteOut.of(n) for n in view.credit_notes] if detail else None,
        )


class InvoiceList(BaseModel):
    data: list[InvoiceOut]


class FinalizeDueOut(BaseModel):
    finalized: list[InvoiceOut]


class StripePushOut(BaseModel):
    invoice_id: int
    stripe_customer_id: str
    stripe_invoice_id: str
    items_created: int
    items_existing: int
    credit_notes_created: int = 0
    amount_due_cents: int | None = None
