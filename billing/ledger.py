"""The ledger: one append-only entry per request id; corrections are reversal entries.

Writing is insert-or-ignore on the unique (request_id, kind), so the same usage
sent twice (a retry, a spool replay after a partial success) is one entry and the
repeat is reported (RecordResult.inserted false), never added; the billing service counts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from billing import usage_rollups
from billing.errors import BillingDomainError
from billing.models import Invoice, LedgerEntry
from billing.periods import month_start
from billing.prices import PriceVersion
from kvgate.db import insert_ignore, utcnow
from kvgate.errors import NotFoundError
from kvgate.usage import EntryKind, TokenCounts

# The entry's token columns in TokenCounts' field order, so their sums make TokenCounts(*sums).
TOKEN_COLUMNS = tuple(getattr(LedgerEntry, column) for column in TokenCounts().as_columns())


class LedgerError(BillingDomainError, ValueError):
    pass


class UsageEntryNotFoundError(NotFoundError, LedgerError):
    pass


@dataclass(frozen=True)
class UsageCharge:
    """A finished request as billing sees it (built from the gateway's UsageEvent)."""

    request_id: str
    tenant_id: str
    api_key_id: str | None
    model: str
    endpoint: str
    status: str
    started_at: datetime
    counts: TokenCounts
    ttft_ms: int | None = None
    latency_ms: int | None = None
    batch: bool = False  # a batch item (gateway/batches): priced at the version's batch rates

    def __post_init__(self) -> None:
        if not self.request_id or len(self.request_id) > 64:
            raise LedgerError("request_id must be 1 to 64 characters")
        if not self.counts.is_non_negative():
            raise LedgerError(f"negative token counts in {self.request_id}: {self.counts}")
        if self.started_at.tzinfo is None:
            raise LedgerError("started_at must be timezone-aware")


@dataclass(frozen=True)
class RecordResult:
    inserted: bool
    entry_id: int
    cost_pico: int
    billing_month: date
    price_version_id: int


async def billing_month_for(*, session: AsyncSession, tenant_id: str, started_at: datetime, now: datetime) -> date:
    """The month an entry is invoiced in, holding the month's invoice against finalization meanwhile.

    Usually the month the request started. If that month's invoice is already
    finalized (a very late record, a spool replayed after the grace period), the
    entry goes to the current month instead of vanishing. The draft row is created
    if missing and share-locked, so finalization cannot slip between this decision
    and the insert (finalize takes the row FOR UPDATE).
    """
    month = month_start(started_at)
    await insert_ignore(session, Invoice, _draft_values(tenant_id, month), ["tenant_id", "period_start"])
    status = await session.scalar(
        select(Invoice.status)
        .where(Invoice.tenant_id == tenant_id, Invoice.period_start == month)
        .with_for_update(read=True)
    )
    if status == "draft":
        return month
    current = month_start(now)
    if current != month:
        await insert_ignore(session, Invoice, _draft_values(tenant_id, current), ["tenant_id", "period_start"])
    return current


def _draft_values(tenant_id: str, month: date) -> dict[str, object]:
    return {
        "tenant_id": tenant_id,
        "period_start": month,
        "status": "draft",
        "currency": "usd",
        "created_at": utcnow(),
    }


async def record_usage(
    *,
    session: AsyncSession,
    charge: UsageCharge,
    version: PriceVersion,
    source: str,
    now: datetime | None = None,
    billing_month: date | None = None,
) -> RecordResult:
    """Append the usage entry for a request, or find the one already there. Caller commits.

    billing_month: from billing_month_for() in this transaction, when the caller already
    asked (to know which budget counters to lock first); otherwise it is decided here.
    """
    now = now or utcnow()
    existing = await _find(session, charge.request_id, EntryKind.USAGE)
    if existing is not None:
        return _result(existing, inserted=False)
    if billing_month is None:
        billing_month = await billing_month_for(
            session=session, tenant_id=charge.tenant_id, started_at=charge.started_at, now=now
        )
    counts = charge.counts
    values = {
        "request_id": charge.request_id,
        "kind": EntryKind.USAGE,
        "tenant_id": charge.tenant_id,
        "api_key_id": charge.api_key_id,
        "model": charge.model,
        "endpoint": charge.endpoint,
        "status": charge.status,
        "started_at": charge.started_at,
        "recorded_at": now,
        "billing_month": billing_month,
        "price_version_id": version.id,
        **counts.as_columns(),
        "cost_pico": version.cost_pico(counts, batch=charge.batch),
        "uncached_cost_pico": version.uncached_cost_pico(counts, batch=charge.batch),
        "ttft_ms": charge.ttft_ms,
        "latency_ms": charge.latency_ms,
        "source": source,
        "reason": None,
        "batch": charge.batch,
    }
    inserted = await insert_ignore(session, LedgerEntry, values, ["request_id", "kind"])
    if inserted:
        await usage_rollups.add_entry(session, values)
    entry = await _find(session, charge.request_id, EntryKind.USAGE)
    assert entry is not None
    return _result(entry, inserted=inserted)  # not inserted: a concurrent writer got there first


async def reverse_usage(
    *, session: AsyncSession, request_id: str, reason: str, now: datetime | None = None
) -> RecordResult:
    """Cancel a request's charge with a negated entry (the original stays). Caller commits."""
    now = now or utcnow()
    original = await _find(session, request_id, EntryKind.USAGE)
    if original is None:
        raise UsageEntryNotFoundError(f"no usage entry for request {request_id!r}")
    existing = await _find(session, request_id, EntryKind.REVERSAL)
    if existing is not None:
        return _result(existing, inserted=False)
    billing_month = await billing_month_for(
        session=session, tenant_id=original.tenant_id, started_at=original.started_at, now=now
    )
    counts = -TokenCounts.from_columns(original)
    values = {
        "request_id": request_id,
        "kind": EntryKind.REVERSAL,
        "tenant_id": original.tenant_id,
        "api_key_id": original.api_key_id,
        "model": original.model,
        "endpoint": original.endpoint,
        "status": original.status,
        "started_at": original.started_at,
        "recorded_at": now,
        "billing_month": billing_month,
        "price_version_id": original.price_version_id,
        **counts.as_columns(),
        "cost_pico": -original.cost_pico,
        "uncached_cost_pico": -original.uncached_cost_pico,
        "ttft_ms": None,
        "latency_ms": None,
        "source": "admin",
        "reason": reason[:500],
        "batch": original.batch,
    }
    inserted = await insert_ignore(session, LedgerEntry, values, ["request_id", "kind"])
    if inserted:
        await usage_rollups.add_entry(session, values)
    entry = await _find(session, request_id, EntryKind.REVERSAL)
    assert entry is not None
    return _result(entry, inserted=inserted)


async def find_entry(*, session: AsyncSession, request_id: str, kind: EntryKind) -> LedgerEntry | None:
    """The request's entry of this kind, if it has one."""
    return await _find(session, request_id, kind)


async def _find(session: AsyncSession, request_id: str, kind: EntryKind) -> LedgerEntry | None:
    return await session.scalar(
        select(LedgerEntry).where(LedgerEntry.request_id == request_id, LedgerEntry.kind == kind)
    )


def _result(entry: LedgerEntry, *, inserted: bool) -> RecordResult:
    return RecordResult(
        inserted=inserted,
        entry_id=entry.id,
        cost_pico=entry.cost_pico,
        billing_month=entry.billing_month,
        price_version_id=entry.price_version_id,
    )
