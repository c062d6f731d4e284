"""Reading the ledger for people: filtered usage lists, and summaries by any of day, model and key."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from billing.csv_export import UsageRow
from billing.errors import BillingDomainError
from billing.ledger import TOKEN_COLUMNS
from billing.models import LedgerEntry
from kvgate.tenancy import ApiKey
from kvgate.usage import EntryKind, TokenCounts

GroupBy = Literal["day", "model", "key"]
GROUP_BYS: tuple[GroupBy, ...] = ("day", "model", "key")
"""A summary groups by any of these at once, in this order (day first, then model, then key)."""


class UsageQueryError(BillingDomainError, ValueError):
    pass


@dataclass(frozen=True)
class UsageFilter:
    tenant_id: str | None = None
    api_key_id: str | None = None
    model: str | None = None
    start: datetime | None = None
    """Inclusive; compared with the request's start time."""
    end: datetime | None = None
    """Exclusive."""

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise UsageQueryError(f"{name} must carry a time zone (e.g. 2026-03-01T00:00:00Z)")
        if self.start and self.end and self.end <= self.start:
            raise UsageQueryError("end must be after start")

    def apply(self, query: Select) -> Select:  # type: ignore[type-arg]
        if self.tenant_id is not None:
            query = query.where(LedgerEntry.tenant_id == self.tenant_id)
        if self.api_key_id is not None:
            query = query.where(LedgerEntry.api_key_id == self.api_key_id)
        if self.model is not None:
            query = query.where(LedgerEntry.model == self.model)
        if self.start is not None:
            query = query.where(LedgerEntry.started_at >= self.start)
        if self.end is not None:
            query = query.where(LedgerEntry.started_at < self.end)
        return query


@dataclass(frozen=True)
class SummaryRow:
    """Usage summed over one group; the fields not grouped by are None.

    api_key_name is the key's name (None for requests made without a key)."""

    day: str | None
    model: str | None
    api_key_id: str | None
    api_key_name: str | None
    requests: int
    counts: TokenCounts
    cost_pico: int
    uncached_cost_pico: int

    @property
    def saved_pico(self) -> int:
        """What the cache saved: the cost without caching less the cost paid."""
        return self.uncached_cost_pico - self.cost_pico

    @property
    def hit_rate(self) -> float | None:
        """cache_read / all prompt tokens (input + writes + reads); None when there were none."""
        prompt = self.counts.prompt_tokens
        return None if prompt <= 0 else self.counts.cache_read / prompt


def to_row(entry: LedgerEntry) -> UsageRow:
    return UsageRow(**{name: getattr(entry, name) for name in UsageRow.__dataclass_fields__})


async def list_usage(
    *, session: AsyncSession, where: UsageFilter, limit: int = 100, after_id: int | None = None
) -> list[UsageRow]:
    """Entries in id order (stable pagination: pass the last id as after_id)."""
    if not 1 <= limit <= 10_000:
        raise UsageQueryError("limit must be between 1 and 10000")
    query = where.apply(select(LedgerEntry)).order_by(LedgerEntry.id).limit(limit)
    if after_id is not None:
        query = query.where(LedgerEntry.id > after_id)
    return [to_row(entry) for entry in (await session.scalars(query)).all()]


async def iter_usage(*, session: AsyncSession, where: UsageFilter, page: int = 1000) -> AsyncIterator[UsageRow]:
    """Every matching entry, a page at a time (for CSV exports of any size)."""
    after: int | None = None
    while True:
        rows = await list_usage(session=session, where=where, limit=page, after_id=after)
        for row in rows:
            yield row
        if len(rows) < page:
            return
        after = rows[-1].id


def _day(session: AsyncSession):  # type: ignore[no-untyped-def]
    if session.bind.dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", LedgerEntry.started_at), "YYYY-MM-DD")
    # SQLite keeps UTC timestamps as ISO text: the first ten characters are the day.
    return func.substr(LedgerEntry.started_at, 1, 10)


async def key_names(*, session: AsyncSession, key_ids: Iterable[str | None]) -> dict[str, str]:
    """The names of these API keys, by id (ids of deleted keys are left out)."""
    wanted = {k for k in key_ids if k is not None}
    if not wanted:
        return {}
    rows = await session.execute(select(ApiKey.id, ApiKey.name).where(ApiKey.id.in_(wanted)))
    return {key_id: name for key_id, name in rows.all()}


def check_group_by(group_by: Sequence[str]) -> tuple[GroupBy, ...]:
    """The group-bys in canonical order, once each; UsageQueryError for an unknown one or none."""
    unknown = [g for g in group_by if g not in GROUP_BYS]
    if unknown or not group_by:
        raise UsageQueryError(f"group_by must be among {', '.join(GROUP_BYS)}, got {', '.join(unknown) or 'none'}")
    return tuple(g for g in GROUP_BYS if g in group_by)


async def summarize(*, session: AsyncSession, where: UsageFilter, group_by: Sequence[str]) -> list[SummaryRow]:
    """Usage summed per group of `group_by` (any of day, model, key), ordered by the groups."""
    groups = check_group_by(group_by)
    columns = {
        "day": _day(session).label("day"),
        "model": LedgerEntry.model.label("model"),
        "key": LedgerEntry.api_key_id.label("api_key_id"),
    }
    keys = [columns[g] for g in groups]
    if "key" in groups:
        # The key's name beside its id (grouped too: PostgreSQL wants every selected column grouped).
        keys.append(ApiKey.name.label("api_key_name"))
    sums = [func.sum(column) for column in TOKEN_COLUMNS]
    query = where.apply(
        select(
            *keys,
            func.count().filter(LedgerEntry.kind == EntryKind.USAGE)
            - func.count().filter(LedgerEntry.kind == EntryKind.REVERSAL),
            *sums,
            func.sum(LedgerEntry.cost_pico),
            func.sum(LedgerEntry.uncached_cost_pico),
        )
    )
    if "key" in groups:
        query = query.outerjoin(ApiKey, ApiKey.id == LedgerEntry.api_key_id)
    # Requests without a key last, on both backends (SQLite sorts NULL first, PostgreSQL last).
    query = query.group_by(*keys).order_by(*(k.nulls_last() for k in keys))
    rows = []
    for row in (await session.execute(query)).all():
        found = row._mapping
        n = len(keys)
        rows.append(
            SummaryRow(
                day=found.get("day"),
                model=found.get("model"),
                api_key_id=found.get("api_key_id"),
                api_key_name=found.get("api_key_name"),
                requests=int(row[n]),
                counts=TokenCounts(*(int(v) for v in row[n + 1 : n + 1 + len(sums)])),
                cost_pico=int(row[n + 1 + len(sums)]),
                uncached_cost_pico=int(row[n + 2 + len(sums)]),
            )
        )
    return rows
