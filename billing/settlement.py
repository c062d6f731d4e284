"""Settling a request: ledger entry, reservation release and spend, in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

from sqlalchemy.ext.asyncio import AsyncSession

from billing import budgets
from billing.ledger import RecordResult, UsageCharge, billing_month_for, find_entry, record_usage, reverse_usage
from billing.models import LedgerEntry
from billing.prices import PriceVersion
from kvgate.db import utcnow
from kvgate.usage import EntryKind


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
    (settlement,) = await settle_charges(session=session, charges=[(charge, version)], source=source, now=now)
    return settlement


async def settle_charges(
    *,
    session: AsyncSession,
    charges: Sequence[tuple[UsageCharge, PriceVersion]],
    source: str,
    now: datetime | None = None,
) -> list[Settlement]:
    """Settle several charges in one transaction (a spool replay's batch of one tenant). Caller commits.

    Locks are taken in one fixed order, the same for a live settlement of one request and a
    replay of many: the reservation rows (by request id), then the month's invoice rows
    (shared, billing_month_for), then every budget counter any of the charges will move
    (budgets.counter_order), and only then the ledger, rollup and counter writes. Without it
    a settlement's release pass and spend pass lock counters in different orders, and a
    replay holding one tenant's counters deadlocks with live settlements on PostgreSQL.
    """
    now = now or utcnow()
    reservations = {}
    for request_id in sorted({charge.request_id for charge, _ in charges}):
        reservations[request_id] = await budgets.lock_reservation(session=session, request_id=request_id)
    counters: set[budgets.CounterKey] = set()
    months: dict[str, date] = {}
    for charge, _ in charges:
        reservation = reservations[charge.request_id]
        if reservation is not None:
            counters.update(budgets.reservation_counters(reservation))
        if charge.request_id in months:
            continue
        if await find_entry(session=session, request_id=charge.request_id, kind=EntryKind.USAGE) is None:
            month = await billing_month_for(
                session=session, tenant_id=charge.tenant_id, started_at=charge.started_at, now=now
            )
            months[charge.request_id] = month
            counters.update(
                budgets.spend_counters(tenant_id=charge.tenant_id, api_key_id=charge.api_key_id, billing_month=month)
            )
    await budgets.lock_counters(session=session, counters=counters)
    settlements = []
    for charge, version in charges:
        result = await record_usage(
            session=session,
            charge=charge,
            version=version,
            source=source,
            now=now,
            billing_month=months.get(charge.request_id),
        )
        released = await budgets.release(session=session, request_id=charge.request_id)
        if result.inserted:
            await _add_spend(session, result, tenant_id=charge.tenant_id, api_key_id=charge.api_key_id)
        settlements.append(Settlement.of(result, released_pico=released))
    return settlements


async def reverse_charge(
    *, session: AsyncSession, request_id: str, reason: str, now: datetime | None = None
) -> Settlement:
    """Cancel a request's charge with a reversal entry and take its cost off the spend counters."""
    now = now or utcnow()
    original = await find_entry(session=session, request_id=request_id, kind=EntryKind.USAGE)
    if original is not None:
        # The counters are locked before the rollup row the reversal updates, in the order a
        # settlement takes them (settle_charges), so the two cannot deadlock.
        month = await billing_month_for(
            session=session, tenant_id=original.tenant_id, started_at=original.started_at, now=now
        )
        await budgets.lock_counters(
            session=session,
            counters=budgets.spend_counters(
                tenant_id=original.tenant_id, api_key_id=original.api_key_id, billing_month=month
            ),
        )
    result = await reverse_usage(session=session, request_id=request_id, reason=reason, now=now)
    if result.inserted:
        entry = await session.get(LedgerEntry, result.entry_id)
        assert entry is not None
        await _add_spend(session, result, tenant_id=entry.tenant_id, api_key_id=entry.api_key_id)
    return Settlement.of(result, released_pico=0)
