"""Billing's request and response bodies, and their converters from domain objects.

The admin API sends and receives them; the CLI prints the same ones (`--json`), so both show
amounts alike: USD as exact decimal strings, never floats. In resource order: usage, prices,
budgets and credit, invoices and credit notes, Stripe, the spool.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PlainSerializer, field_validator

from billing.budgets import BudgetStatus, CounterState
from billing.csv_export import UsageRow
from billing.invoices import InvoiceView
from billing.models import CreditGrant, CreditNote, KeyBudget
from billing.money import format_usd_exact
from billing.prices import PriceSpec, PriceVersion
from billing.profiles import Address, BillingProfile, TaxId, TaxTreatment
from billing.settlement import Settlement
from billing.usage_queries import SummaryRow


def usd_text(pico: int | None) -> str | None:
    """Pico-dollars as an exact USD string (None stays None: 'no limit')."""
    return None if pico is None else format_usd_exact(pico)


def cents_text(cents: int) -> str:
    return str(Decimal(cents).scaleb(-2))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


UsdAmount = Annotated[str, Field(pattern=r"^-?\d{1,12}(\.\d{1,12})?$", description="USD as a decimal string")]


class UsageOut(BaseModel):
    id: int
    request_id: str
    kind: str
    tenant_id: str
    api_key_id: str | None
    model: str
    endpoint: str
    status: str
    started_at: datetime
    billing_month: str
    price_version_id: int
    input_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    cache_write_24h_tokens: int
    cache_write_30m_tokens: int
    cache_write_12h_tokens: int
    cache_read_tokens: int
    output_tokens: int
    cost_usd: str
    uncached_cost_usd: str
    ttft_ms: int | None
    latency_ms: int | None

    @classmethod
    def of(cls, row: UsageRow) -> UsageOut:
        values = row.shown()
        return cls(**{k: values[k] for k in cls.model_fields})


class UsageList(BaseModel):
    data: list[UsageOut]
    next_after_id: int | None


class SummaryOut(BaseModel):
    key: str | None
    requests: int
    input_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    cache_write_24h_tokens: int
    cache_write_30m_tokens: int
    cache_write_12h_tokens: int
    cache_read_tokens: int
    output_tokens: int
    cost_usd: str
    uncached_cost_usd: str

    @classmethod
    def of(cls, row: SummaryRow) -> SummaryOut:
        return cls(
            key=row.key,
            requests=row.requests,
            **row.counts.as_columns(),
            cost_usd=format_usd_exact(row.cost_pico),
            uncached_cost_usd=format_usd_exact(row.uncached_cost_pico),
        )


class SummaryList(BaseModel):
    group_by: str
    data: list[SummaryOut]


class ReverseIn(_Strict):
    reason: str = Field(min_length=1, max_length=500)


class ReverseOut(BaseModel):
    request_id: str
    created: bool
    entry_id: int
    cost_usd: str
    billing_month: str

    @classmethod
    def of(cls, request_id: str, settlement: Settlement) -> ReverseOut:
        return cls(
            request_id=request_id,
            created=settlement.inserted,
            entry_id=settlement.entry_id,
            cost_usd=format_usd_exact(settlement.cost_pico),
            billing_month=settlement.billing_month.strftime("%Y-%m"),
        )


class PriceIn(_Strict):
    model: str = Field(min_length=1, max_length=200)
    effective_from: AwareDatetime
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    cache_write_5m_multiplier: Decimal = Decimal("1.25")
    cache_write_1h_multiplier: Decimal = Decimal("2.0")
    cache_read_multiplier: Decimal = Decimal("0.1")
    cache_write_24h_multiplier: Decimal | None = None
    cache_write_30m_multiplier: Decimal = Decimal("1.7")
    cache_write_12h_multiplier: Decimal = Decimal("5.0")

    @field_validator("*", mode="before")
    @classmethod
    def _no_floats(cls, value: Any) -> Any:
        # JSON numbers arrive as floats; go through their text so 0.1 stays 0.1.
        return str(value) if isinstance(value, float) else value

    def spec(self) -> PriceSpec:
        """The price as the catalog takes it (PriceSpec checks the ranges: PriceError)."""
        return PriceSpec(**self.model_dump())


class PriceOut(BaseModel):
    id: int
    model: str
    effective_from: datetime
    input_usd_per_mtok: str
    output_usd_per_mtok: str
    cache_write_5m_multiplier: str
    cache_write_1h_multiplier: str
    cache_read_multiplier: str
    cache_write_24h_multiplier: str | None
    cache_write_30m_multiplier: str
    cache_write_12h_multiplier: str
    ttl_classes: list[str]

    @classmethod
    def of(cls, v: PriceVersion) -> PriceOut:
        return cls(
            id=v.id,
            model=v.model,
            effective_from=v.effective_from,
            input_usd_per_mtok=str(v.input_usd_per_mtok),
            output_usd_per_mtok=str(v.output_usd_per_mtok),
            cache_write_5m_multiplier=str(v.cache_write_5m_multiplier),
            cache_write_1h_multiplier=str(v.cache_write_1h_multiplier),
            cache_read_multiplier=str(v.cache_read_multiplier),
            cache_write_24h_multiplier=None
            if v.cache_write_24h_multiplier is None
            else str(v.cache_write_24h_multiplier),
            cache_write_30m_multiplier=str(v.cache_write_30m_multiplier),
            cache_write_12h_multiplier=str(v.cache_write_12h_multiplier),
            ttl_classes=list(v.ttl_classes),
        )


class PriceList(BaseModel):
    data: list[PriceOut]


class TenantBudgetIn(_Strict):
    monthly_limit_usd: UsdAmount | None = None
    prepaid: bool | None = None


class KeyBudgetIn(_Strict):
    monthly_limit_usd: UsdAmount | None = None


class CounterOut(BaseModel):
    period: str
    limit_usd: str | None
    spent_usd: str
    reserved_usd: str
    remaining_usd: str | None

    @classmethod
    def of(cls, state: CounterState) -> CounterOut:
        return cls(
            period=state.period,
            limit_usd=usd_text(state.limit_pico),
            spent_usd=format_usd_exact(state.spent_pico),
            reserved_usd=format_usd_exact(state.reserved_pico),
            remaining_usd=usd_text(state.remaining_pico),
        )


class BudgetOut(BaseModel):
    tenant_id: str
    monthly_limit_usd: str | None
    prepaid: bool
    credit_granted_usd: str
    month: CounterOut
    credit: CounterOut

    @classmethod
    def of(cls, status: BudgetStatus) -> BudgetOut:
        return cls(
            tenant_id=status.tenant_id,
            monthly_limit_usd=usd_text(status.monthly_limit_pico),
            prepaid=status.prepaid,
            credit_granted_usd=format_usd_exact(status.credit_granted_pico),
            month=CounterOut.of(status.month),
            credit=CounterOut.of(status.credit),
        )


class KeyBudgetOut(BaseModel):
    api_key_id: str
    tenant_id: str
    monthly_limit_usd: str | None

    @classmethod
    def of(cls, budget: KeyBudget) -> KeyBudgetOut:
        return cls(
            api_key_id=budget.api_key_id,
            tenant_id=budget.tenant_id,
            monthly_limit_usd=usd_text(budget.monthly_limit_pico),
        )


class CreditIn(_Strict):
    amount_usd: UsdAmount
    note: str = Field("", max_length=500)
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)


class CreditOut(BaseModel):
    id: int
    tenant_id: str
    amount_usd: str
    note: str
    created_at: datetime
    created: bool

    @classmethod
    def of(cls, grant: CreditGrant, *, created: bool) -> CreditOut:
        return cls(
            id=grant.id,
            tenant_id=grant.tenant_id,
            amount_usd=format_usd_exact(grant.amount_pico),
            note=grant.note,
            created_at=grant.created_at,
            created=created,
        )


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


class CreditNoteIn(_Strict):
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


class SpoolOut(BaseModel):
    pending: int
    replayed: int | None = None
    applied: int | None = None
    corrupt: int | None = None


class WebhookOut(BaseModel):
    received: bool
    outcome: str


# -- billing profiles ---------------------------------------------------------------------------

# A tax rate goes out as the JSON number it came in as (19, 7.7), from an exact Decimal.
RatePercent = Annotated[
    Decimal,
    Field(ge=0, le=100, max_digits=7, decimal_places=4),
    PlainSerializer(lambda d: int(d) if d == d.to_integral_value() else float(d), when_used="json"),
]
ShortText = Annotated[str, Field(min_length=1, max_length=200)]


class AddressBody(_Strict):
    line1: ShortText
    line2: Annotated[str, Field(max_length=200)] | None = None
    city: Annotated[str, Field(min_length=1, max_length=100)]
    postal_code: Annotated[str, Field(min_length=1, max_length=20)]
    state: Annotated[str, Field(max_length=100)] | None = None
    country: Annotated[str, Field(pattern=r"^[A-Z]{2}$", description="ISO 3166-1 alpha-2, e.g. DE")]


class TaxIdBody(_Strict):
    type: Annotated[str, Field(pattern=r"^[a-z][a-z_]{1,31}$", description="Stripe's tax ID type, e.g. eu_vat")]
    value: Annotated[str, Field(min_length=1, max_length=64)]


class TaxBody(_Strict):
    treatment: Literal["standard", "reverse_charge", "exempt"]
    rate_percent: RatePercent | None = None
    note: Annotated[str, Field(max_length=500)] | None = None


class BillingProfileBody(_Strict):
    """PUT and GET /admin/v1/tenants/{id}/billing-profile: the same shape both ways."""

    legal_name: ShortText
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", max_length=320)] | None = None
    address: AddressBody | None = None
    tax_id: TaxIdBody | None = None
    tax: TaxBody
    currency: Annotated[str, Field(pattern=r"^[a-z]{3}$")] = "usd"
    po_number: Annotated[str, Field(max_length=64)] | None = None

    def to_profile(self) -> BillingProfile:
        """The domain profile; an inconsistent tax block (standard without a rate) is a 400 naming it."""
        return BillingProfile(
            legal_name=self.legal_name,
            email=self.email,
            address=Address(**self.address.model_dump()) if self.address else None,
            tax_id=TaxId(**self.tax_id.model_dump()) if self.tax_id else None,
            tax=TaxTreatment(**self.tax.model_dump()),
            currency=self.currency,
            po_number=self.po_number,
        )

    @classmethod
    def of(cls, profile: BillingProfile) -> BillingProfileBody:
        return cls.model_validate(
            {
                "legal_name": profile.legal_name,
                "email": profile.email,
                "address": None if profile.address is None else profile.address.__dict__,
                "tax_id": None if profile.tax_id is None else profile.tax_id.__dict__,
                "tax": profile.tax.__dict__,
                "currency": profile.currency,
                "po_number": profile.po_number,
            }
        )
