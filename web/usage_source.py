"""Where the Usage and Cache pages read their numbers: the hourly usage rollups of one tenant.

The one place the pages touch the rollup table, so that moving to another bucketed query
(billing's shared usage_buckets) changes only this module. Rows come back per hour, model and key;
the pages fold them into their buckets and splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from billing.models import UsageRollup
from billing.usage_rollups import NO_KEY
from kvgate.tenancy import ApiKey
from kvgate.usage import TokenCounts
from web.usage_view import UsageView


@dataclass(frozen=True)
class HourRow:
    hour: datetime
    model: str
    api_key_id: str
    """NO_KEY ("") for usage without a key."""
    requests: int
    counts: TokenCounts
    cost_pico: int
    uncached_cost_pico: int


@dataclass(frozen=True)
class FilterChoices:
    """What the filter menus offer: the values this tenant has usage for, and its keys by name."""

    models: list[str]
    endpoints: list[str]
    statuses: list[str]
    key_names: dict[str, str]


async def hour_rows(*, session: AsyncSession, tenant_id: str, view: UsageView) -> list[HourRow]:
    """The tenant's usage in the view's range and filters, summed per hour, model and key."""
    r = UsageRollup
    token_sums = [
        func.sum(getattr(r, f"{name}_tokens"))
        for name in ("input", "cache_write_5m", "cache_write_1h", "cache_write_24h", "cache_read", "output")
    ]
    query = (
        select(
            r.hour,
            r.model,
            r.api_key_id,
            func.sum(r.requests),
            *token_sums,
            func.sum(r.cost_pico),
            func.sum(r.uncached_cost_pico),
        )
        .where(r.tenant_id == tenant_id, r.hour >= view.start, r.hour < view.end)
        .group_by(r.hour, r.model, r.api_key_id)
        .order_by(r.hour, r.model, r.api_key_id)
    )
    for column, value in (
        (r.model, view.model),
        (r.api_key_id, view.key),
        (r.endpoint, view.endpoint),
        (r.status, view.status),
    ):
        if value is not None:
            query = query.where(column == value)
    return [
        HourRow(
            hour=hour,
            model=model,
            api_key_id=key_id,
            requests=int(requests),
            counts=TokenCounts(*(int(v) for v in sums[:6])),
            cost_pico=int(sums[6]),
            uncached_cost_pico=int(sums[7]),
        )
        for hour, model, key_id, requests, *sums in (await session.execute(query)).all()
    ]


async def filter_choices(*, session: AsyncSession, tenant_id: str) -> FilterChoices:
    r = UsageRollup

    async def values(column) -> list[str]:  # type: ignore[no-untyped-def]
        rows = await session.scalars(select(column).distinct().where(r.tenant_id == tenant_id).order_by(column))
        return list(rows.all())

    keys = (await session.execute(select(ApiKey.id, ApiKey.name).where(ApiKey.tenant_id == tenant_id))).all()
    return FilterChoices(
        models=await values(r.model),
        endpoints=await values(r.endpoint),
        statuses=await values(r.status),
        key_names={key_id: name for key_id, name in keys},
    )


def key_label(key_id: str, names: dict[str, str]) -> str:
    """A key as people know it: its name (keys are never shown by id)."""
    if key_id == NO_KEY:
        return "(no key)"
    return names.get(key_id, "(deleted key)")
