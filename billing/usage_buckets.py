"""Usage in time buckets: the one query behind the usage API and the dashboard's charts and summaries.

Hour and day buckets read the hourly rollups (billing.usage_rollups), a month of requests in hundreds
of rows; minute buckets read the ledger itself (its tenant/start index). Both sum the same entries the
same way, so a bucket's numbers equal its ledger entries' sums and the invoice's.

A request is counted once, by its usage entry; a reversal subtracts its tokens and cost but not the
request (it happened). Buckets are UTC-aligned: the range is widened to whole buckets
(start floored, end ceiled), and every bucket in it is returned, empty ones with no results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import ColumnElement, case, func, literal_column, select
from sqlalchemy.ext.asyncio import AsyncSession

from billing.errors import BillingDomainError
from billing.models import LedgerEntry, UsageRollup
from billing.usage_rollups import NO_KEY, ROLLUP_SUMS, TOKEN_SUMS
from kvgate.usage import EntryKind, TokenCounts

Width = Literal["1m", "1h", "1d"]
GroupKey = Literal["model", "api_key_id"]
WIDTHS: dict[str, timedelta] = {"1m": timedelta(minutes=1), "1h": timedelta(hours=1), "1d": timedelta(days=1)}
GROUP_KEYS: tuple[GroupKey, ...] = ("model", "api_key_id")
MAX_BUCKETS = 100_000
"""A guard against a runaway range (a year of minutes); the usage API's own limits are far lower."""

HOUR = WIDTHS["1h"]
# The bucket's start as text, the same on both backends: SQLite keeps UTC timestamps as
# "YYYY-MM-DD HH:MM:SS.ffffff", so a prefix of it is the start; PostgreSQL formats it so.
_PREFIX_CHARS = {"1m": 16, "1h": 13, "1d": 10}
_PG_FORMATS = {"1m": "YYYY-MM-DD HH24:MI", "1h": "YYYY-MM-DD HH24", "1d": "YYYY-MM-DD"}
_PY_FORMATS = {"1m": "%Y-%m-%d %H:%M", "1h": "%Y-%m-%d %H", "1d": "%Y-%m-%d"}


class UsageBucketError(BillingDomainError, ValueError):
    pass


@dataclass(frozen=True)
class BucketResult:
    """Usage summed over one bucket and one group (model and/or key; None where not grouped by it).

    api_key_id is None too for requests made without a key.
    """

    model: str | None
    api_key_id: str | None
    requests: int
    counts: TokenCounts
    cost_pico: int
    uncached_cost_pico: int

    @property
    def saved_pico(self) -> int:
        """What caching saved: the cost without caching less the cost paid."""
        return self.uncached_cost_pico - self.cost_pico

    def __add__(self, other: BucketResult) -> BucketResult:
        return BucketResult(
            model=self.model if self.model == other.model else None,
            api_key_id=self.api_key_id if self.api_key_id == other.api_key_id else None,
            requests=self.requests + other.requests,
            counts=self.counts + other.counts,
            cost_pico=self.cost_pico + other.cost_pico,
            uncached_cost_pico=self.uncached_cost_pico + other.uncached_cost_pico,
        )


def empty_result(*, model: str | None = None, api_key_id: str | None = None) -> BucketResult:
    return BucketResult(
        model=model, api_key_id=api_key_id, requests=0, counts=TokenCounts(), cost_pico=0, uncached_cost_pico=0
    )


@dataclass(frozen=True)
class Bucket:
    start: datetime
    end: datetime
    results: list[BucketResult] = field(default_factory=list)


@dataclass(frozen=True)
class _Filters:
    tenant_id: str
    models: Sequence[str]
    api_key_ids: Sequence[str]
    endpoints: Sequence[str]
    statuses: Sequence[str]


def floor_to(moment: datetime, width: Width) -> datetime:
    """The start of the UTC bucket holding `moment`."""
    moment = moment.astimezone(UTC)
    if width == "1d":
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if width == "1h":
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(second=0, microsecond=0)


def ceil_to(moment: datetime, width: Width) -> datetime:
    """The end of the UTC bucket ending at or after `moment`."""
    floored = floor_to(moment, width)
    return floored if floored == moment else floored + WIDTHS[width]


def _check_range(start: datetime, end: datetime) -> None:
    for name, value in (("start", start), ("end", end)):
        if value.tzinfo is None:
            raise UsageBucketError(f"{name} must carry a time zone", field=name)
    if end <= start:
        raise UsageBucketError("end must be after start", field="end")


def _check_group_by(group_by: Sequence[str]) -> tuple[GroupKey, ...]:
    for key in group_by:
        if key not in GROUP_KEYS:
            raise UsageBucketError(f"group_by must be among {', '.join(GROUP_KEYS)}, got {key!r}", field="group_by")
    return tuple(key for key in GROUP_KEYS if key in group_by)


class _Source:
    """Where sums come from: the rollups (whole hours) or the ledger (any range)."""

    def __init__(self, *, rollups: bool) -> None:
        self.rollups = rollups
        table: Any = UsageRollup if rollups else LedgerEntry
        self.table = table
        self.time = table.hour if rollups else table.started_at
        self.requests = (
            func.sum(UsageRollup.requests)
            if rollups
            else func.sum(case((LedgerEntry.kind == EntryKind.USAGE, 1), else_=0))
        )
        self.sums = [func.sum(getattr(table, name)) for name in ROLLUP_SUMS]

    def column(self, name: str) -> Any:
        return getattr(self.table, name)

    def bucket(self, session: AsyncSession, width: Width) -> ColumnElement[str]:
        # Literals, not bound parameters: PostgreSQL matches the GROUP BY expression to the
        # selected one only when they are the same text, and $1 is not $3.
        if session.bind is not None and session.bind.dialect.name == "postgresql":
            return func.to_char(
                func.timezone(literal_column("'UTC'"), self.time), literal_column(f"'{_PG_FORMATS[width]}'")
            )
        return func.substr(self.time, literal_column("1"), literal_column(str(_PREFIX_CHARS[width])))


ROLLUPS = _Source(rollups=True)
LEDGER = _Source(rollups=False)


async def _sums(
    *,
    session: AsyncSession,
    source: _Source,
    where: _Filters,
    start: datetime,
    end: datetime,
    width: Width | None,
    group_by: tuple[GroupKey, ...],
) -> list[tuple[datetime | None, BucketResult]]:
    """(bucket start or None, sums) per bucket and group over [start, end)."""
    keys: list[Any] = []
    if width is not None:
        keys.append(source.bucket(session, width).label("bucket"))
    keys.extend(source.column(name).label(name) for name in group_by)
    query = select(*keys, source.requests, *source.sums).where(
        source.column("tenant_id") == where.tenant_id, source.time >= start, source.time < end
    )
    for name, values in (
        ("model", where.models),
        ("api_key_id", where.api_key_ids),
        ("endpoint", where.endpoints),
        ("status", where.statuses),
    ):
        if values:
            query = query.where(source.column(name).in_(list(values)))
    if keys:
        query = query.group_by(*keys)
    found = []
    # Many rows share a bucket (a month of hours by model and key: ~15 rows an hour); strptime is the
    # costliest step per row, so each bucket's text is parsed once.
    parsed: dict[str, datetime] = {}
    for row in (await session.execute(query)).all():
        values = list(row)
        bucket = None
        if width is not None:
            text = values.pop(0)
            if text not in parsed:
                parsed[text] = _parse_bucket(text, width)
            bucket = parsed[text]
        grouped = {name: values.pop(0) for name in group_by}
        requests, *sums = values
        if requests is None:  # an aggregate over no rows at all
            continue
        key_id = grouped.get("api_key_id")
        result = BucketResult(
            model=grouped.get("model"),
            api_key_id=None if key_id in (None, NO_KEY) else key_id,
            requests=int(requests),
            counts=TokenCounts(*(int(v) for v in sums[:TOKEN_SUMS])),
            cost_pico=int(sums[TOKEN_SUMS]),
            uncached_cost_pico=int(sums[TOKEN_SUMS + 1]),
        )
        found.append((bucket, result))
    return found


def _parse_bucket(text: str, width: Width) -> datetime:
    return datetime.strptime(text.replace("T", " "), _PY_FORMATS[width]).replace(tzinfo=UTC)


def _sort_key(result: BucketResult) -> tuple[str, str]:
    return (result.model or "", result.api_key_id or "")


async def usage_buckets(
    *,
    session: AsyncSession,
    tenant_id: str,
    start: datetime,
    end: datetime,
    width: Width,
    group_by: Sequence[GroupKey] = (),
    models: Sequence[str] = (),
    api_key_ids: Sequence[str] = (),
    endpoints: Sequence[str] = (),
    statuses: Sequence[str] = (),
    from_ledger: bool = False,
) -> list[Bucket]:
    """A tenant's usage per UTC bucket of `width` over [start, end) widened to whole buckets.

    Every bucket is there, in time order; its results are one per group present (sorted by model,
    then key), none for an empty bucket. Empty filters match everything. `from_ledger` reads the
    ledger even for hours and days (to check the rollups, or to measure what they save).
    """
    if width not in WIDTHS:
        raise UsageBucketError(f"width must be one of {', '.join(WIDTHS)}, got {width!r}", field="width")
    _check_range(start, end)
    grouping = _check_group_by(group_by)
    first, last = floor_to(start, width), ceil_to(end, width)
    step = WIDTHS[width]
    if (last - first) / step > MAX_BUCKETS:
        raise UsageBucketError(f"more than {MAX_BUCKETS} buckets of {width}: narrow the range", field="end")
    where = _Filters(tenant_id, models, api_key_ids, endpoints, statuses)
    source = LEDGER if width == "1m" or from_ledger else ROLLUPS
    found = await _sums(
        session=session, source=source, where=where, start=first, end=last, width=width, group_by=grouping
    )
    by_start: dict[datetime, list[BucketResult]] = {}
    for bucket, result in found:
        assert bucket is not None
        by_start.setdefault(bucket, []).append(result)
    buckets = []
    moment = first
    while moment < last:
        results = sorted(by_start.get(moment, []), key=_sort_key)
        buckets.append(Bucket(start=moment, end=moment + step, results=results))
        moment += step
    return buckets


async def usage_breakdown(
    *,
    session: AsyncSession,
    tenant_id: str,
    start: datetime,
    end: datetime,
    group_by: Sequence[GroupKey] = (),
    models: Sequence[str] = (),
    api_key_ids: Sequence[str] = (),
    endpoints: Sequence[str] = (),
    statuses: Sequence[str] = (),
    from_ledger: bool = False,
) -> list[BucketResult]:
    """A tenant's usage over exactly [start, end), one result per group present (sorted).

    Whole hours come from the rollups; the partial hours at either edge (or, with `from_ledger`,
    everything) from the ledger.
    """
    _check_range(start, end)
    grouping = _check_group_by(group_by)
    where = _Filters(tenant_id, models, api_key_ids, endpoints, statuses)
    whole_start, whole_end = ceil_to(start, "1h"), floor_to(end, "1h")
    if whole_start < whole_end and not from_ledger:
        pieces = [(ROLLUPS, whole_start, whole_end), (LEDGER, start, whole_start), (LEDGER, whole_end, end)]
    else:
        pieces = [(LEDGER, start, end)]
    merged: dict[tuple[str, str], BucketResult] = {}
    for source, piece_start, piece_end in pieces:
        if piece_start >= piece_end:
            continue
        found = await _sums(
            session=session,
            source=source,
            where=where,
            start=piece_start,
            end=piece_end,
            width=None,
            group_by=grouping,
        )
        for _, result in found:
            key = _sort_key(result)
            merged[key] = merged[key] + result if key in merged else result
    return [merged[key] for key in sorted(merged)]


async def usage_totals(
    *,
    session: AsyncSession,
    tenant_id: str,
    start: datetime,
    end: datetime,
    models: Sequence[str] = (),
    api_key_ids: Sequence[str] = (),
    endpoints: Sequence[str] = (),
    statuses: Sequence[str] = (),
    from_ledger: bool = False,
) -> BucketResult:
    """A tenant's usage summed over exactly [start, end) (zeros when there is none)."""
    results = await usage_breakdown(
        session=session,
        tenant_id=tenant_id,
        start=start,
        end=end,
        models=models,
        api_key_ids=api_key_ids,
        endpoints=endpoints,
        statuses=statuses,
        from_ledger=from_ledger,
    )
    return results[0] if results else empty_result()
