"""Where the Usage and Cache pages read their numbers: the hourly usage rollups of one tenant.

Sums come from billing's usage_buckets (the query behind the usage API too, so the page and the API
agree by construction), per hour (or day: row_width), model and key; the pages fold them into their
buckets and splits.
Filter menus read the distinct values straight from the rollups.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from billing.models import UsageRollup
from billing.pricebook import PriceBook
from billing.usage_buckets import Width, floor_to, usage_buckets
from billing.usage_rollups import NO_KEY
from kvgate.tenancy import ApiKey
from kvgate.usage import TokenCounts
from web.usage_view import UsageView


class HourRow(NamedTuple):
    """A tuple, not a frozen dataclass: a month by model and key is ten thousand of them, built per page view."""

    hour: datetime
    """The row's hour, or its day (row_width)."""
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


def row_width(view: UsageView, prices: PriceBook) -> Width:
    """Days for a view by day in which no price version starts within a day, else hours.

    Rows are priced by category at the version in force at their start (web.usage_tables.price). When no
    version starts within a day, one version holds the whole day, so a day's row prices exactly as its
    24 hours do: a month by model and key is then hundreds of rows, not ten thousand to fold per view.
    """
    if view.hourly:
        return "1h"
    changes = (v.effective_from for v in prices.versions())
    within_a_day = any(view.start < at < view.end and at != floor_to(at, "1d") for at in changes)
    return "1h" if within_a_day else "1d"


async def hour_rows(*, session: AsyncSession, tenant_id: str, view: UsageView, prices: PriceBook) -> list[HourRow]:
    """The tenant's usage in the view's range and filters, summed per model and key and per hour
    (or per day, where that prices the same: row_width)."""
    buckets = await usage_buckets(
        session=session,
        tenant_id=tenant_id,
        start=view.start,
        end=view.end,
        width=row_width(view, prices),
        group_by=("model", "api_key_id"),
        models=_one(view.model),
        api_key_ids=_one(view.key),
        endpoints=_one(view.endpoint),
        statuses=_one(view.status),
    )
    return [
        HourRow(
            hour=bucket.start,
            model=result.model or "",
            api_key_id=result.api_key_id or NO_KEY,
            requests=result.requests,
            counts=result.counts,
            cost_pico=result.cost_pico,
            uncached_cost_pico=result.uncached_cost_pico,
        )
        for bucket in buckets
        for result in bucket.results
    ]


def _one(value: str | None) -> tuple[str, ...]:
    return () if value is None else (value,)


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
