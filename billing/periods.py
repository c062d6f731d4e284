"""Billing periods: calendar months in UTC."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from billing.errors import BillingDomainError


class PeriodError(BillingDomainError, ValueError):
    """A month that is not YYYY-MM."""


def month_start(at: datetime) -> date:
    """The first day of the UTC month containing `at`."""
    at = at.astimezone(UTC)
    return date(at.year, at.month, 1)


def next_month(month: date) -> date:
    return date(month.year + month.month // 12, month.month % 12 + 1, 1)


def month_bounds(month: date) -> tuple[datetime, datetime]:
    """[start, end) of a month as aware UTC datetimes."""
    end = next_month(month)
    return (
        datetime(month.year, month.month, 1, tzinfo=UTC),
        datetime(end.year, end.month, 1, tzinfo=UTC),
    )


def period_key(month: date) -> str:
    """'YYYY-MM', the budget counters' period."""
    return f"{month.year:04d}-{month.month:02d}"


def parse_month(text: str) -> date:
    """'2026-11' -> date(2026, 11, 1); PeriodError (a ValueError) otherwise."""
    try:
        parsed = datetime.strptime(text, "%Y-%m")
    except ValueError:
        raise PeriodError(f"expected a month as YYYY-MM, got {text!r}") from None
    return date(parsed.year, parsed.month, 1)


def finalizable_at(month: date, grace: timedelta) -> datetime:
    """When a month's invoices may be finalized automatically: its end plus the grace period."""
    return month_bounds(month)[1] + grace
