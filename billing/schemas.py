"""Billing's request and response bodies, and their converters from domain objects.

The admin API sends and receives them; the CLI prints the same ones (`--output json|csv`), so both show
amounts alike: USD as exact decimal strings, never floats. In resource order: usage, prices,
budgets and credit, invoices and credit notes, Stripe, the spool.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from billing.budgets import BudgetStatus, CounterState, KeyLimitState
from billing.csv_export import UsageRow
from billing.models import CreditGrant, KeyBudget
from billing.money import format_usd_exact
from billing.prices import PRICE_FIELDS, PriceChange, PriceVersion
from billing.settlement import Settlement
from billing.usage_queries import SummaryRow

if TYPE_CHECKING:
    from billing.operations import AddedPrice


def usd_text(pico: int | None) -> str | None:
    """Pico-dollars as an exact USD string (None stays None: 'no limit')."""
    return None if pico is None else format_usd_exact(pico)


def cents_text(cents: int) -> str:
    return str(Decimal(cents).scaleb(-2))


class StrictBody(BaseModel):
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
    """Usage summed over one group. The group's fields (day, model, api_key_id with api_key_name)
    are null where the summary is not grouped by them."""

    day: str | None
    model: str | None
    api_key_id: str | None
    api_key_name: str | None
    requests: int
    input_tokens: int
    cache_write_5m_tokens: int
    cache_write_30m_tokens: int
    cache_write_1h_tokens: int
    cache_write_12h_tokens: int
    cache_write_24h_tokens: int
    cache_read_tokens: int
    output_tokens: int
    hit_rate: float | None = Field(description="cache_read_tokens / all prompt tokens; null with no prompt tokens")
    cost_usd: str
    uncached_cost_usd: str = Field(description="What the same requests would have cost without caching")
    saved_usd: str = Field(description="What the cache saved: uncached_cost_usd - cost_usd")

    @classmethod
    def of(cls, row: SummaryRow) -> SummaryOut:
        rate = row.hit_rate
        return cls(
            day=row.day,
            model=row.model,
            api_key_id=row.api_key_id,
            api_key_name=row.api_key_name,
            requests=row.requests,
            **row.counts.as_columns(),
            hit_rate=None if rate is None else round(rate, 4),
            cost_usd=format_usd_exact(row.cost_pico),
            uncached_cost_usd=format_usd_exact(row.uncached_cost_pico),
            saved_usd=format_usd_exact(row.saved_pico),
        )


class SummaryList(BaseModel):
    group_by: list[str]
    data: list[SummaryOut]


class ReverseIn(StrictBody):
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


class PriceIn(StrictBody):
    """A new version. Fields left out are carried over from the model's version before it (the
    response's carried_over names them); a model's first version takes the default multipliers.
    cache_write_24h_multiplier: null stops offering the 24h class."""

    model: str = Field(min_length=1, max_length=200)
    effective_from: AwareDatetime
    input_usd_per_mtok: Decimal | None = None
    output_usd_per_mtok: Decimal | None = None
    cache_write_5m_multiplier: Decimal | None = None
    cache_write_30m_multiplier: Decimal | None = None
    cache_write_1h_multiplier: Decimal | None = None
    cache_write_12h_multiplier: Decimal | None = None
    cache_write_24h_multiplier: Decimal | None = None
    cache_read_multiplier: Decimal | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _no_floats(cls, value: Any) -> Any:
        # JSON numbers arrive as floats; go through their text so 0.1 stays 0.1.
        return str(value) if isinstance(value, float) else value

    def change(self) -> PriceChange:
        """The change as the catalog takes it: only the price fields the body set (PriceError if invalid)."""
        given = {name: getattr(self, name) for name in PRICE_FIELDS if name in self.model_fields_set}
        return PriceChange(model=self.model, effective_from=self.effective_from, given=given)


def price_text(value: Decimal | None) -> str | None:
    """A price or multiplier at fixed decimals: at least two, more only where the value has them."""
    if value is None:
        return None
    places = max(2, -value.normalize().as_tuple().exponent)  # type: ignore[operator]
    return f"{value:.{places}f}"


class PriceOut(BaseModel):
    """A version; prices and multipliers as decimal strings with at least two decimals ("3.00")."""

    id: int
    model: str
    effective_from: datetime
    input_usd_per_mtok: str
    output_usd_per_mtok: str
    cache_write_5m_multiplier: str
    cache_write_30m_multiplier: str
    cache_write_1h_multiplier: str
    cache_write_12h_multiplier: str
    cache_write_24h_multiplier: str | None
    cache_read_multiplier: str
    ttl_classes: list[str]

    @classmethod
    def of(cls, v: PriceVersion) -> PriceOut:
        prices = {name: price_text(getattr(v, name)) for name in PRICE_FIELDS}
        return cls(id=v.id, model=v.model, effective_from=v.effective_from, ttl_classes=list(v.ttl_classes), **prices)


class PriceAddedOut(PriceOut):
    carried_over: list[str] = Field(
        description="The fields the request left out, carried over from the version carried_from_id"
    )
    carried_from_id: int | None

    @classmethod
    def added(cls, added: AddedPrice) -> PriceAddedOut:
        out = PriceOut.of(added.version).model_dump()
        return cls(**out, carried_over=list(added.carried_over), carried_from_id=added.carried_from)


class PriceList(BaseModel):
    data: list[PriceOut]


class TenantBudgetIn(StrictBody):
    monthly_limit_usd: UsdAmount | None = None
    prepaid: bool | None = None


class KeyBudgetIn(StrictBody):
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


class KeyLimitOut(BaseModel):
    """An API key's own monthly limit (null: none; the tenant's limits still apply) and this month's spend."""

    api_key_id: str
    name: str
    revoked: bool
    monthly_limit_usd: str | None
    spent_usd: str
    reserved_usd: str
    remaining_usd: str | None

    @classmethod
    def of(cls, key: KeyLimitState) -> KeyLimitOut:
        return cls(
            api_key_id=key.api_key_id,
            name=key.name,
            revoked=key.revoked,
            monthly_limit_usd=usd_text(key.month.limit_pico),
            spent_usd=format_usd_exact(key.month.spent_pico),
            reserved_usd=format_usd_exact(key.month.reserved_pico),
            remaining_usd=usd_text(key.month.remaining_pico),
        )


class BudgetOut(BaseModel):
    tenant_id: str
    monthly_limit_usd: str | None
    prepaid: bool
    credit_granted_usd: str
    month: CounterOut
    credit: CounterOut
    keys: list[KeyLimitOut] = Field(description="Every unrevoked key, and revoked ones with spend this month")

    @classmethod
    def of(cls, status: BudgetStatus) -> BudgetOut:
        return cls(
            tenant_id=status.tenant_id,
            monthly_limit_usd=usd_text(status.monthly_limit_pico),
            prepaid=status.prepaid,
            credit_granted_usd=format_usd_exact(status.credit_granted_pico),
            month=CounterOut.of(status.month),
            credit=CounterOut.of(status.credit),
            keys=[KeyLimitOut.of(key) for key in status.keys],
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


class CreditIn(StrictBody):
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


class SpoolOut(BaseModel):
    pending: int
    replayed: int | None = None
    applied: int | None = None
    corrupt: int | None = None


class WebhookOut(BaseModel):
    received: bool
    outcome: str
