"""The numbers behind the Overview, Keys and Admin pages, from billing's exact queries.

Spend is the ledger's (billing.usage_buckets), the same sums the invoice makes; limits and credit are
billing's budgets. Nothing here rounds: pages format pico-dollars at the edge (web.formatting).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from fractions import Fraction

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from billing import budgets
from billing.invoices import FINALIZED, PAYMENT_FAILED
from billing.models import CreditNote, Invoice, KeyBudget
from billing.periods import month_bounds, month_start
from billing.usage_buckets import BucketResult, empty_result, usage_breakdown, usage_totals
from kvgate.tenancy import ApiKey, Tenant
from web.formatting import ratio, usd
from web.refusals import RefusalCount, refusal_counts

WARN_AT = Fraction(8, 10)
"""Alerts at 80% of a budget, and again at 100%."""
FORECAST_RULE = "month-to-date spend × (length of the month ÷ time elapsed so far): the run rate so far, held"


@dataclass(frozen=True)
class BudgetBar:
    """Spend against a limit (None: no limit, so no bar)."""

    label: str
    spent_pico: int
    limit_pico: int | None
    limit_is_tenants: bool = False
    """A key without a limit of its own, drawn against the tenant's."""
    reserved_pico: int = 0
    """Held by requests in flight: their worst case, until each settles at its real cost."""

    @property
    def fraction(self) -> Fraction | None:
        if self.limit_pico is None:
            return None
        if self.limit_pico == 0:
            return Fraction(1) if self.spent_pico <= 0 else Fraction(self.spent_pico + 1, 1)
        return Fraction(self.spent_pico, self.limit_pico)

    @property
    def width_percent(self) -> int:
        """The bar's drawn width (it stops at 100 however far over the budget it is)."""
        value = self.fraction
        return 0 if value is None else max(0, min(100, int(value * 100)))

    @property
    def reserve_width_percent(self) -> int:
        """The reserve's drawn width, after the spend's (together they stop at 100)."""
        if self.limit_pico is None or self.reserved_pico <= 0:
            return 0
        whole = Fraction(self.spent_pico + self.reserved_pico, max(self.limit_pico, 1))
        return max(0, min(100, int(whole * 100)) - self.width_percent)

    @property
    def level(self) -> str:
        value = self.fraction
        if value is None or value < WARN_AT:
            return "ok"
        return "warning" if value < 1 else "over"


@dataclass(frozen=True)
class Alert:
    level: str
    """warning (80%) or over (100%)."""
    message: str


@dataclass(frozen=True)
class Overview:
    month_label: str
    totals: BucketResult
    tenant_bar: BudgetBar
    key_bars: list[BudgetBar]
    forecast_pico: int
    forecast_rule: str
    forecast_hours: float
    """How much of the month the forecast is drawn from."""
    credit: budgets.CounterState | None
    """Prepaid credit (limit: granted; remaining); None when the tenant is not prepaid."""
    alerts: list[Alert] = field(default_factory=list)
    refusals: list[RefusalCount] = field(default_factory=list)
    """This month's refused requests by the limit that refused them (web/refusals.py)."""

    @property
    def refused(self) -> int:
        return sum(r.requests for r in self.refusals)

    @property
    def hit_rate(self) -> Fraction | None:
        """read / (input + writes + read): the share of prompt tokens served from the cache."""
        counts = self.totals.counts
        return ratio(counts.cache_read, counts.prompt_tokens)

    @property
    def saved_pico(self) -> int:
        return self.totals.saved_pico

    @property
    def saved_fraction(self) -> Fraction | None:
        return ratio(self.totals.saved_pico, self.totals.uncached_cost_pico)

    @property
    def forecast_multiple(self) -> Fraction | None:
        """The forecast over the tenant's monthly budget (None without one)."""
        limit = self.tenant_bar.limit_pico
        return Fraction(self.forecast_pico, limit) if limit else None


def forecast(spent_pico: int, *, now: datetime) -> int:
    """The month's spend if it goes on at the rate so far (FORECAST_RULE), in whole pico-dollars."""
    start, end = month_bounds(month_start(now))
    elapsed = int((now - start).total_seconds() * 1_000_000)
    whole = int((end - start).total_seconds() * 1_000_000)
    return spent_pico if elapsed <= 0 else spent_pico * whole // elapsed


def _alerts(bars: list[BudgetBar]) -> list[Alert]:
    found = []
    for bar in bars:
        if bar.limit_is_tenants or bar.fraction is None or bar.level == "ok":
            continue
        if bar.level == "over":
            message = f"{bar.label} has used all of its monthly budget of {usd(bar.limit_pico or 0)}"
        else:
            message = f"{bar.label} has used over 80% of its monthly budget of {usd(bar.limit_pico or 0)}"
        found.append(Alert(level=bar.level, message=message))
    return found


async def key_names(session: AsyncSession, *, tenant_id: str) -> dict[str, ApiKey]:
    keys = await session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at))
    return {key.id: key for key in keys}


async def key_spend(session: AsyncSession, *, tenant_id: str, now: datetime) -> dict[str | None, BucketResult]:
    """This month's usage per key (None: requests made without a key)."""
    start, _ = month_bounds(month_start(now))
    if now <= start:
        return {}
    results = await usage_breakdown(
        session=session, tenant_id=tenant_id, start=start, end=now, group_by=("api_key_id",)
    )
    return {result.api_key_id: result for result in results}


async def month_totals(session: AsyncSession, *, tenant_id: str, now: datetime) -> BucketResult:
    """The tenant's usage from the start of this month until `now`."""
    start, _ = month_bounds(month_start(now))
    if now <= start:
        return empty_result()
    return await usage_totals(session=session, tenant_id=tenant_id, start=start, end=now)


async def key_limits(session: AsyncSession, *, tenant_id: str) -> dict[str, int | None]:
    rows = await session.scalars(select(KeyBudget).where(KeyBudget.tenant_id == tenant_id))
    return {row.api_key_id: row.monthly_limit_pico for row in rows}


async def tenant_overview(session: AsyncSession, *, tenant: Tenant, now: datetime) -> Overview:
    month = month_start(now)
    start, _ = month_bounds(month)
    totals = (
        await usage_totals(session=session, tenant_id=tenant.id, start=start, end=now)
        if now > start
        else empty_result()
    )
    status = await budgets.budget_status(session=session, tenant_id=tenant.id, now=now)
    tenant_bar = BudgetBar(
        label=tenant.name,
        spent_pico=totals.cost_pico,
        limit_pico=status.monthly_limit_pico,
        reserved_pico=status.month.reserved_pico,
    )
    reserved = {key.api_key_id: key.month.reserved_pico for key in status.keys}
    names = await key_names(session, tenant_id=tenant.id)
    limits = await key_limits(session, tenant_id=tenant.id)
    spend = await key_spend(session, tenant_id=tenant.id, now=now)
    key_bars = []
    for key_id, key in names.items():
        used = spend.get(key_id)
        if key.revoked_at is not None and used is None:
            continue
        own = limits.get(key_id)
        key_bars.append(
            BudgetBar(
                label=key.name,
                spent_pico=used.cost_pico if used else 0,
                limit_pico=own if own is not None else status.monthly_limit_pico,
                limit_is_tenants=own is None,
                reserved_pico=reserved.get(key_id, 0),
            )
        )
    return Overview(
        month_label=month.strftime("%B %Y"),
        totals=totals,
        tenant_bar=tenant_bar,
        key_bars=key_bars,
        forecast_pico=forecast(totals.cost_pico, now=now),
        forecast_rule=FORECAST_RULE,
        forecast_hours=(now - month_bounds(month_start(now))[0]).total_seconds() / 3600,
        credit=status.credit if status.prepaid else None,
        alerts=_alerts([tenant_bar, *key_bars]),
        refusals=await refusal_counts(session, tenant_id=tenant.id, start=start, end=now),
    )


@dataclass(frozen=True)
class TenantRow:
    """One line of the operator's table."""

    tenant: Tenant
    totals: BucketResult
    budget: BudgetBar
    unpaid_invoices: int
    unpaid_cents: int

    @property
    def hit_rate(self) -> Fraction | None:
        return ratio(self.totals.counts.cache_read, self.totals.counts.prompt_tokens)


async def _unpaid(session: AsyncSession) -> dict[str, tuple[int, int]]:
    """Per tenant: unpaid invoices and what is still due on them, tax included and credit notes taken off."""
    open_invoices = Invoice.status.in_((FINALIZED, PAYMENT_FAILED))
    due = {
        tenant_id: (int(count), int(cents or 0))
        for tenant_id, count, cents in await session.execute(
            select(Invoice.tenant_id, func.count(), func.sum(Invoice.total_cents + func.coalesce(Invoice.tax_cents, 0)))
            .where(open_invoices)
            .group_by(Invoice.tenant_id)
        )
    }
    credited = await session.execute(
        select(Invoice.tenant_id, func.sum(CreditNote.amount_cents))
        .join(CreditNote, CreditNote.invoice_id == Invoice.id)
        .where(open_invoices)
        .group_by(Invoice.tenant_id)
    )
    for tenant_id, cents in credited:
        count, total = due[tenant_id]
        due[tenant_id] = (count, total - int(cents or 0))
    return due


async def tenant_rows(session: AsyncSession, *, now: datetime) -> list[TenantRow]:
    """Every tenant's month so far (a few queries per tenant: the operator's page, not a hot path)."""
    unpaid = await _unpaid(session)
    rows = []
    for tenant in await session.scalars(select(Tenant).order_by(Tenant.name, Tenant.id)):
        totals = await month_totals(session, tenant_id=tenant.id, now=now)
        status = await budgets.budget_status(session=session, tenant_id=tenant.id, now=now)
        count, cents = unpaid.get(tenant.id, (0, 0))
        rows.append(
            TenantRow(
                tenant=tenant,
                totals=totals,
                budget=BudgetBar(tenant.name, totals.cost_pico, status.monthly_limit_pico),
                unpaid_invoices=count,
                unpaid_cents=cents,
            )
        )
    return rows
