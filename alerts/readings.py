"""What the evaluator reads for one tenant: its budgets (billing's counters), its refusals (usage records with
status "refused"), and its hourly prompt tokens and spend (billing's usage rollups, one row per hour)."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from alerts.rules import TRAILING_HOURS, BudgetReading, CacheWindow
from billing.budgets import KEY_MONTH, TENANT_MONTH, budget_status
from billing.models import UsageRollup
from kvgate.tenancy import UsageRecord
from kvgate.usage import TokenCounts

REFUSED = "refused"
# Every token column of the rollups, from TokenCounts (so a new TTL class is counted without a change here).
TOKEN_COLUMNS = tuple(f"{f.name}_tokens" for f in fields(TokenCounts))


def hour_start(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


async def budget_readings(session: AsyncSession, *, tenant_id: str, now: datetime) -> list[BudgetReading]:
    """The tenant's monthly budget and each unrevoked key's own, where one is set."""
    status = await budget_status(session=session, tenant_id=tenant_id, now=now)
    readings = []
    if status.month.limit_pico is not None:
        readings.append(
            BudgetReading(
                TENANT_MONTH, tenant_id, "tenant", status.month.period, status.month.limit_pico, status.month.spent_pico
            )
        )
    for key in status.keys:
        if key.month.limit_pico is not None and not key.revoked:
            readings.append(
                BudgetReading(
                    KEY_MONTH, key.api_key_id, key.name, key.month.period, key.month.limit_pico, key.month.spent_pico
                )
            )
    return readings


async def refusals_since(session: AsyncSession, *, tenant_id: str, since: datetime, until: datetime) -> int:
    query = select(func.count()).where(
        UsageRecord.tenant_id == tenant_id,
        UsageRecord.status == REFUSED,
        UsageRecord.started_at >= since,
        UsageRecord.started_at < until,
    )
    return int(await session.scalar(query) or 0)


async def cache_window(session: AsyncSession, *, tenant_id: str, start: datetime, end: datetime) -> CacheWindow:
    """Prompt tokens (input, every TTL class's writes, reads) and reads over whole hours [start, end)."""
    sums = [func.coalesce(func.sum(getattr(UsageRollup, c)), 0).label(c) for c in TOKEN_COLUMNS]
    row = (
        await session.execute(
            select(*sums).where(UsageRollup.tenant_id == tenant_id, UsageRollup.hour >= start, UsageRollup.hour < end)
        )
    ).one()
    counts = TokenCounts.from_columns({c: int(v) for c, v in row._mapping.items()})
    return CacheWindow(prompt_tokens=counts.prompt_tokens, read_tokens=counts.cache_read)


async def hourly_spend(session: AsyncSession, *, tenant_id: str, start: datetime, hours: int) -> list[int]:
    """The tenant's spend in each of `hours` whole hours from `start`, empty hours as 0."""
    end = start + timedelta(hours=hours)
    rows = await session.execute(
        select(UsageRollup.hour, func.sum(UsageRollup.cost_pico))
        .where(UsageRollup.tenant_id == tenant_id, UsageRollup.hour >= start, UsageRollup.hour < end)
        .group_by(UsageRollup.hour)
    )
    by_hour = {hour_start(hour): int(total or 0) for hour, total in rows.all()}
    return [by_hour.get(start + timedelta(hours=i), 0) for i in range(hours)]


async def spend_window(session: AsyncSession, *, tenant_id: str, hour: datetime) -> tuple[int, list[int]]:
    """The spend of the hour starting at `hour` and of each of the TRAILING_HOURS before it."""
    spends = await hourly_spend(
        session, tenant_id=tenant_id, start=hour - timedelta(hours=TRAILING_HOURS), hours=TRAILING_HOURS + 1
    )
    return spends[-1], spends[:-1]
