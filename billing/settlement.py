"""Settling a request: ledger entry, reservation release and spend, in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from billing import budgets
from billing.ledger import RecordResult, UsageCharge, record_usage, reverse_usage
from billing.models import LedgerEntry
from billing.prices import PriceVersion


@dataclass(frozen=True)
class Settlement:
    inserted: bool
    entry_id: int
    cost_pico: int
    billing_month: date
    released_pico: int

    @classmethod
    def of(cls, result: RecordResult, *, released_pico: int) -> Settlement:
        return cls(
            inserted=result.inserted,
            entry_id=result.entry_id,
            cost_pico=result.cost_pico,
            billing_month=result.billing_month,
            released_pico=released_pico,
        )


async def _add_spend(session: AsyncSession, result: RecordResult, *, tenant_id: str, api_key_id: str | None) -> None:
    await budgets.add_spend(
        session=session,
        tenant_id=tenant_id,
        api_key_id=api_key_id,
        billing_month=result.billing_month,
        cost_pico=result.cost_pico,
    )


async def settle_charge(
    *,
    session: AsyncSession,
    charge: UsageCharge,
    version: PriceVersion,
    source: str,
    now: datetime | None = None,
) -> Settlement:
    """Record the charge and move its budget from reserved to spent. Caller commits.

    A repeated settlement (same request id) finds the entry already there and adds
    no spend, which is what makes spool replays and retries safe.
    """
    result = await record_usage(session=session, charge=charge, version=version, source=source, now=now)
    released = await budgets.release(session=session, request_id=charge.request_id)
    if result.inserted:
        await _add_spend(session, result, tenant_id=charge.tenant_id, api_key_id=charge.api_key_id)
    return Settlement.of(result, released_pico=released)


async def reverse_charge(
    *, session: AsyncSession, request_id: str, reason: str, now: datetime | None = None
) -> Settlement:
    """Cancel a request's charge with a reversal entry and take its cost off the spend counters."""
    result = await reverse_usage(session=session, request_id=request_id, reason=reason, now=now)
    if result.inserted:
        entry = await session.get(LedgerEntry, result.entry_id)
        assert entry is not None
        await _add_spend(session, result, tenant_id=entry.tenant_id, api_key_id=entry.api_key_id)
    return Settlement.of(result, released_pico=0)
