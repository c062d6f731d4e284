"""Dependencies for the tenant-facing API: the calling key, and the usage API's query parameters.

The caller is authenticated by the gateway, not here (billing never imports the gateway): the
composition root mounts this package's router behind the gateway's scope check, which leaves the
caller's principal in request.state.principal. A request that reaches a route without one is refused,
so a router mounted without the check fails closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Protocol

from fastapi import Depends, Request
from starlette.datastructures import QueryParams

from billing.usage_buckets import GROUP_KEYS, WIDTHS, GroupKey, Width, ceil_to, floor_to
from kvgate.db import utcnow
from kvgate.errors import AuthenticationError, InvalidRequestError


class Caller(Protocol):
    """What billing needs of the gateway's Principal."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def api_key_id(self) -> str: ...

    @property
    def scopes(self) -> tuple[str, ...]: ...

    @property
    def requests_per_minute(self) -> int | None: ...

    @property
    def input_tokens_per_minute(self) -> int | None: ...

    @property
    def expires_at(self) -> datetime | None: ...


async def get_caller(request: Request) -> Caller:
    caller = getattr(request.state, "principal", None)
    if caller is None:
        raise AuthenticationError("an API key is required")
    return caller


CallerDep = Annotated[Caller, Depends(get_caller)]

# OpenAI's bucket limits per width: (default, max).
COMPLETIONS_LIMITS: dict[str, tuple[int, int]] = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}
# OpenAI's costs API has days only (default 7, max 180); kvgate also answers by hour.
COSTS_LIMITS: dict[str, tuple[int, int]] = {"1h": (24, 168), "1d": (7, 180)}
# 9998-12-31T23:59:59Z. Not datetime's last second (9999-12-31T23:59:59Z): a range must still have
# room after it for rounding its end up to a whole bucket and a page of up to 180 days, which past
# year 9999 overflows datetime (that was a 500). Negative times (before 1970) are refused too.
LATEST_UNIX_S = 253_370_764_799


@dataclass(frozen=True)
class UsagePage:
    """One page of a bucketed query: the buckets [start, end) of `width`, filters and grouping."""

    start: datetime
    end: datetime
    width: Width
    has_more: bool
    next_page: str | None
    group_by: tuple[GroupKey, ...]
    models: tuple[str, ...]
    api_key_ids: tuple[str, ...]


def _values(params: QueryParams, name: str) -> list[str]:
    """A list parameter sent as name[]=a&name[]=b (the openai SDK), name=a&name=b, or name=a,b."""
    found: list[str] = []
    for raw in (*params.getlist(f"{name}[]"), *params.getlist(name)):
        found.extend(part.strip() for part in raw.split(",") if part.strip())
    return found


def _unix(params: QueryParams, name: str, *, required: bool) -> datetime | None:
    raw = params.get(name)
    if raw is None or raw == "":
        if required:
            raise InvalidRequestError(f"{name} is required (Unix seconds)", param=name)
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} must be an integer (Unix seconds), got {raw!r}", param=name) from None
    if not 0 <= value <= LATEST_UNIX_S:
        raise InvalidRequestError(f"{name} must be between 0 and {LATEST_UNIX_S}", param=name)
    return datetime.fromtimestamp(value, UTC)


def _limit(params: QueryParams, width: str, limits: dict[str, tuple[int, int]]) -> int:
    default, most = limits[width]
    raw = params.get("limit")
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequestError(f"limit must be an integer, got {raw!r}", param="limit") from None
    if not 1 <= value <= most:
        raise InvalidRequestError(f"limit must be between 1 and {most} for bucket_width={width}", param="limit")
    return value


def parse_page(params: QueryParams, *, limits: dict[str, tuple[int, int]], now: datetime | None = None) -> UsagePage:
    """The page a usage query asks for, or a 400 naming the parameter at fault."""
    width = params.get("bucket_width") or "1d"
    if width not in limits:
        raise InvalidRequestError(
            f"bucket_width must be one of {', '.join(limits)}, got {width!r}", param="bucket_width"
        )
    assert width in WIDTHS
    start = _unix(params, "start_time", required=True)
    assert start is not None
    end = _unix(params, "end_time", required=False) or (now or utcnow())
    if end <= start:
        raise InvalidRequestError("end_time must be after start_time", param="end_time")
    first, last = floor_to(start, width), ceil_to(end, width)  # type: ignore[arg-type]
    step = WIDTHS[width]
    page_start = _cursor(params.get("page"), first=first, last=last, step=step)
    page_end = min(page_start + _limit(params, width, limits) * step, last)
    group_by = _values(params, "group_by")
    for key in group_by:
        if key not in GROUP_KEYS:
            raise InvalidRequestError(
                f"group_by {key!r} is not supported: kvgate groups by {' and '.join(GROUP_KEYS)}", param="group_by"
            )
    return UsagePage(
        start=page_start,
        end=page_end,
        width=width,  # type: ignore[arg-type]
        has_more=page_end < last,
        next_page=str(int(page_end.timestamp())) if page_end < last else None,
        group_by=tuple(key for key in GROUP_KEYS if key in group_by),
        models=tuple(_values(params, "models")),
        api_key_ids=tuple(_values(params, "api_key_ids")),
    )


def _cursor(raw: str | None, *, first: datetime, last: datetime, step: timedelta) -> datetime:
    """The page cursor is the Unix second its first bucket starts (opaque to clients: next_page)."""
    if raw is None or raw == "":
        return first
    try:
        at = datetime.fromtimestamp(int(raw), UTC)
    except (ValueError, OverflowError, OSError):
        raise InvalidRequestError(f"page {raw!r} is not a cursor this query returned", param="page") from None
    if not first <= at < last or (at - first) % step:
        raise InvalidRequestError(f"page {raw!r} is not a cursor this query returned", param="page")
    return at


async def completions_page(request: Request) -> UsagePage:
    return parse_page(request.query_params, limits=COMPLETIONS_LIMITS)


async def costs_page(request: Request) -> UsagePage:
    return parse_page(request.query_params, limits=COSTS_LIMITS)


CompletionsPage = Annotated[UsagePage, Depends(completions_page)]
CostsPage = Annotated[UsagePage, Depends(costs_page)]
