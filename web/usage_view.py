"""What the Usage and Cache pages show: the range, bucket width and filters read from the URL's query string.

The filters live in the URL so a view can be bookmarked, shared and exported (`/usage.csv?<same query>`).
Days and hours are UTC, as on invoices. A range of 48 hours or less is shown by hour, longer ones by day.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Literal
from urllib.parse import urlencode

from starlette.datastructures import QueryParams

from billing.periods import month_bounds, month_start

Preset = Literal["today", "7d", "mtd", "last_month", "custom"]
PRESETS: dict[str, str] = {
    "today": "Today",
    "7d": "7 days",
    "mtd": "Month to date",
    "last_month": "Last month",
    "custom": "Custom",
}
SPLITS: dict[str, str] = {"model": "Model", "key": "Key"}
UNITS: dict[str, str] = {"tokens": "Tokens", "usd": "$"}
HOURLY_UP_TO = timedelta(hours=48)
# A custom range longer than this is refused: a chart of more days is unreadable and the table too long.
MAX_RANGE = timedelta(days=400)


class ViewError(ValueError):
    """A query string that names no view (a bad date, an unknown preset): shown on the page, status 400."""


@dataclass(frozen=True)
class UsageView:
    preset: str
    start: datetime
    """Inclusive, UTC midnight."""
    end: datetime
    """Exclusive, UTC midnight."""
    unit: str = "tokens"
    split: str = "model"
    model: str | None = None
    key: str | None = None
    """An API key id (the page shows its name)."""
    endpoint: str | None = None
    status: str | None = None

    @property
    def hourly(self) -> bool:
        return self.end - self.start <= HOURLY_UP_TO

    @property
    def bucket(self) -> timedelta:
        return timedelta(hours=1) if self.hourly else timedelta(days=1)

    def buckets(self) -> list[datetime]:
        """Every bucket's start in the range, empty ones included (a chart point per day or hour)."""
        starts, at = [], self.start
        while at < self.end:
            starts.append(at)
            at += self.bucket
        return starts

    def bucket_of(self, hour: datetime) -> datetime:
        hour = hour.astimezone(UTC)
        return hour if self.hourly else hour.replace(hour=0)

    def label(self, bucket: datetime) -> str:
        return bucket.strftime("%Y-%m-%d %H:00") if self.hourly else bucket.strftime("%Y-%m-%d")

    @property
    def last_day(self) -> date:
        return (self.end - timedelta(days=1)).date()

    def query(self, **changes: str | None) -> str:
        """This view's query string, with some parameters changed (None drops one)."""
        values: dict[str, str | None] = {
            "preset": self.preset,
            "start": self.start.date().isoformat() if self.preset == "custom" else None,
            "end": self.last_day.isoformat() if self.preset == "custom" else None,
            "unit": self.unit,
            "split": self.split,
            "model": self.model,
            "key": self.key,
            "api": self.endpoint,
            "status": self.status,
        }
        values.update(changes)
        return urlencode({name: value for name, value in values.items() if value})


# The days a custom range may name: from the Unix epoch (no usage is older) to the end of year 9998.
FIRST_DAY = date(1970, 1, 1)
LAST_DAY = date(9998, 12, 31)


def parse_view(params: QueryParams, *, now: datetime) -> UsageView:
    """The view a query string asks for; the default is month to date, by model, in tokens."""
    preset = params.get("preset") or ("custom" if params.get("start") else "mtd")
    if preset not in PRESETS:
        raise ViewError(f"preset must be one of {', '.join(PRESETS)}")
    start, end = _range(preset, params, now.astimezone(UTC))
    unit = params.get("unit") or "tokens"
    split = params.get("split") or "model"
    if unit not in UNITS:
        raise ViewError(f"unit must be one of {', '.join(UNITS)}")
    if split not in SPLITS:
        raise ViewError(f"split must be one of {', '.join(SPLITS)}")
    view = UsageView(preset=preset, start=start, end=end, unit=unit, split=split)
    return replace(
        view,
        model=_text(params, "model", 200),
        key=_text(params, "key", 40),
        endpoint=_text(params, "api", 64),
        status=_text(params, "status", 32),
    )


def _text(params: QueryParams, name: str, limit: int) -> str | None:
    value = params.get(name) or None
    if value is not None and len(value) > limit:
        raise ViewError(f"{name} is longer than {limit} characters")
    return value


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _range(preset: str, params: QueryParams, now: datetime) -> tuple[datetime, datetime]:
    today = now.date()
    tomorrow = _midnight(today + timedelta(days=1))
    if preset == "today":
        return _midnight(today), tomorrow
    if preset == "7d":
        return _midnight(today - timedelta(days=6)), tomorrow
    if preset == "mtd":
        return month_bounds(month_start(now))[0], tomorrow
    if preset == "last_month":
        this_month = month_start(now)
        return month_bounds(month_start(_midnight(this_month) - timedelta(days=1)))
    first, last = _day(params, "start"), _day(params, "end")
    if last < first:
        raise ViewError("end must be on or after start")
    start, end = _midnight(first), _midnight(last + timedelta(days=1))
    if end - start > MAX_RANGE:
        raise ViewError(f"a range may cover at most {MAX_RANGE.days} days")
    return start, end


def _day(params: QueryParams, name: str) -> date:
    value = params.get(name)
    if not value:
        raise ViewError(f"a custom range needs {name} (YYYY-MM-DD)")
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise ViewError(f"{name} is not a date (YYYY-MM-DD): {value[:40]!r}") from None
    # A range ends at the midnight after its last day, and the page steps around it: a day at
    # datetime's edge (year 1, 9999-12-31) overflowed there and gave a 500.
    if not FIRST_DAY <= day <= LAST_DAY:
        raise ViewError(f"{name} must be between {FIRST_DAY.isoformat()} and {LAST_DAY.isoformat()}")
    return day
