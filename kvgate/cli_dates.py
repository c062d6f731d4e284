"""Times on the command line: `--start`/`--end` as `YYYY-MM-DD` (UTC midnight) or ISO 8601 with a
zone, and `--month YYYY-MM` for a whole calendar month (UTC).

Use the option types in a command's signature; each parses (or refuses, naming the option) before the
command runs, and `time_range` joins them into one [start, end) range:

    def summary(start: StartOption = None, end: EndOption = None, month: MonthOption = None) -> None:
        start, end = time_range(start=start, end=end, month=month)
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Annotated

import typer

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_MONTH = re.compile(r"(\d{4})-(\d{2})")
FORMATS = "YYYY-MM-DD (UTC midnight) or ISO 8601 with a zone, e.g. 2026-11-01T09:00:00+01:00"


def parse_when(text: str) -> datetime:
    """A point in time, in UTC. A bare date is UTC midnight; a time must say its zone (Z or an offset):
    a local time without one is ambiguous, so it is refused."""
    text = text.strip()
    if _DATE.fullmatch(text):
        try:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), tzinfo=UTC)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a date ({exc})") from None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give {FORMATS}") from None
    if value.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone: add one (e.g. {text}Z for UTC) or give a date, YYYY-MM-DD")
    return value.astimezone(UTC)


def month_range(text: str) -> tuple[datetime, datetime]:
    """`YYYY-MM` as [first instant of the month, first instant of the next), in UTC."""
    found = _MONTH.fullmatch(text.strip())
    if not found or not 1 <= int(found.group(2)) <= 12:
        raise ValueError(f"{text!r} is not a month: give YYYY-MM, e.g. 2026-11")
    year, month = int(found.group(1)), int(found.group(2))
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def _month(text: str) -> str:
    month_range(text)  # refuses a malformed month before the command runs
    return text.strip()


def time_range(
    *, start: datetime | None = None, end: datetime | None = None, month: str | None = None
) -> tuple[datetime | None, datetime | None]:
    """One [start, end) range from the options; `--month` excludes `--start`/`--end`. A ValueError
    (printed as `error: ...`) when they conflict or end is not after start."""
    if month is not None:
        if start is not None or end is not None:
            raise ValueError("give --month, or --start/--end, not both")
        return month_range(month)
    if start is not None and end is not None and end <= start:
        raise ValueError(f"--end ({end.isoformat()}) must be after --start ({start.isoformat()})")
    return start, end


StartOption = Annotated[
    datetime | None,
    typer.Option("--start", parser=parse_when, metavar="WHEN", help=f"inclusive: {FORMATS}"),
]
EndOption = Annotated[
    datetime | None,
    typer.Option("--end", parser=parse_when, metavar="WHEN", help="exclusive, same formats as --start"),
]
MonthOption = Annotated[
    str | None,
    typer.Option("--month", parser=_month, metavar="YYYY-MM", help="a whole calendar month (UTC)"),
]
