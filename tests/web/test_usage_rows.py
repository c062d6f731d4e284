"""Day rows price like their hours (row_width): the Usage and Cache pages read a month by day only when
no price version starts within one of its days."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from starlette.datastructures import QueryParams

from billing.pricebook import PriceBook
from billing.prices import PriceVersion
from kvgate.usage import TokenCounts
from web.usage_source import HourRow, row_width
from web.usage_tables import UsageTables, fold
from web.usage_view import UsageView, parse_view

NOW = datetime(2026, 10, 20, 12, tzinfo=UTC)
MODEL = "m-test"


def version(version_id: int, at: datetime, input_usd: str) -> PriceVersion:
    return PriceVersion(
        id=version_id,
        model=MODEL,
        effective_from=at,
        input_usd_per_mtok=Decimal(input_usd),
        output_usd_per_mtok=Decimal(4),
    )


def october(split: str = "model") -> UsageView:
    return parse_view(QueryParams(f"start=2026-10-01&end=2026-10-31&split={split}"), now=NOW)


def hour_rows() -> list[HourRow]:
    """Two keys' usage in every hour of 3-5 October (the cost columns are made up: fold only adds them)."""
    rows = []
    for hour in range(72):
        at = datetime(2026, 10, 3, tzinfo=UTC) + timedelta(hours=hour)
        for key in ("key_a", "key_b"):
            counts = TokenCounts(input=100 + hour, cache_write_5m=40, cache_write_1h=hour % 3, cache_read=900, output=7)
            rows.append(HourRow(at, MODEL, key, 2, counts, 1_000 + hour, 3_000 + hour))
    return rows


def by_day(rows: list[HourRow]) -> list[HourRow]:
    """The same rows summed per day, model and key: what usage_buckets gives at width 1d."""
    days: dict[tuple[datetime, str, str], HourRow] = {}
    for row in rows:
        key = (row.hour.replace(hour=0), row.model, row.api_key_id)
        seen = days.get(key)
        days[key] = (
            row._replace(hour=key[0])
            if seen is None
            else seen._replace(
                requests=seen.requests + row.requests,
                counts=seen.counts + row.counts,
                cost_pico=seen.cost_pico + row.cost_pico,
                uncached_cost_pico=seen.uncached_cost_pico + row.uncached_cost_pico,
            )
        )
    return list(days.values())


def figures(tables: UsageTables) -> list[object]:
    cells = [(label, s.requests, s.counts, s.category_cost_pico, s.reads_at_input_pico) for label, s in tables.buckets]
    details = [(d.bucket, d.split, d.sums.counts, d.sums.category_cost_pico) for d in tables.details]
    return [cells, details, tables.total.counts, tables.total.category_cost_pico, tables.total.savings_pico]


def test_a_month_reads_days_when_every_price_starts_at_midnight_and_they_price_the_same() -> None:
    book = PriceBook(
        [version(1, datetime(2026, 1, 1, tzinfo=UTC), "1"), version(2, datetime(2026, 10, 4, tzinfo=UTC), "2")]
    )
    view = october()
    assert row_width(view, book) == "1d"
    for split in ("model", "key"):
        names = {"key_a": "alpha", "key_b": "beta"}
        hourly = fold(hour_rows(), view=october(split), prices=book, key_names=names)
        daily = fold(by_day(hour_rows()), view=october(split), prices=book, key_names=names)
        assert figures(daily) == figures(hourly)
        assert len(hourly.details) == (3 if split == "model" else 6)
    # The two versions' rates differ, so the days' dollars do too: the comparison above can fail.
    costs = [sums.category_cost_pico for _, sums in fold(hour_rows(), view=view, prices=book, key_names={}).buckets]
    assert costs[2] != costs[3]


def test_a_price_starting_within_a_day_keeps_hours_which_price_differently_from_the_day() -> None:
    noon = datetime(2026, 10, 4, 12, tzinfo=UTC)
    book = PriceBook([version(1, datetime(2026, 1, 1, tzinfo=UTC), "1"), version(2, noon, "2")])
    assert row_width(october(), book) == "1h"
    hourly = fold(hour_rows(), view=october(), prices=book, key_names={})
    daily = fold(by_day(hour_rows()), view=october(), prices=book, key_names={})
    assert figures(daily) != figures(hourly)
    # Outside the view, or in a view by hour, such a version changes nothing.
    november = parse_view(QueryParams("start=2026-11-01&end=2026-11-30"), now=NOW)
    assert row_width(november, book) == "1d"
    assert row_width(parse_view(QueryParams("start=2026-10-04&end=2026-10-04"), now=NOW), book) == "1h"
