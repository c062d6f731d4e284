"""GET /v1/key, OpenRouter's shape: the calling key's spend today, this week, this month and in all,
the tightest spending limit it is held to and what is left of it, and its rate limits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi import APIRouter, Request
from sqlalchemy.ext.asyncio import AsyncSession

from billing.api.deps import SessionDep
from billing.api.tenant.deps import Caller, CallerDep
from billing.api.tenant.schemas import KeyInfo, KeyInfoOut, KeyUsd, RateLimit, usd, usd_float
from billing.budgets import key_limits
from billing.periods import month_bounds, month_start
from billing.usage_buckets import floor_to, usage_totals
from kvgate.db import utcnow
from kvgate.errors import AuthenticationError
from kvgate.tenancy import ApiKey

router = APIRouter(prefix="/v1/key", tags=["usage"])


async def _spent(session: AsyncSession, caller: Caller, start: datetime, end: datetime) -> int:
    total = await usage_totals(
        session=session, tenant_id=caller.tenant_id, start=start, end=end, api_key_ids=[caller.api_key_id]
    )
    return total.cost_pico


def _server_default(request: Request, name: str) -> int | None:
    # The gateway's setting for keys without their own limit (read, not imported: billing sits beside it).
    settings = getattr(getattr(request.app.state, "gateway", None), "settings", None)
    return getattr(settings, name, None)


@router.get("", response_model=KeyInfoOut)
async def key_info(request: Request, caller: CallerDep, session: SessionDep) -> KeyInfoOut:
    key = await session.get(ApiKey, caller.api_key_id)
    if key is None or key.tenant_id != caller.tenant_id:
        raise AuthenticationError("invalid x-api-key")
    now = utcnow()
    today = floor_to(now, "1d")
    tomorrow = today + timedelta(days=1)
    week = today - timedelta(days=today.weekday())
    month, month_end = month_bounds(month_start(now))
    since = min(floor_to(key.created_at, "1h"), datetime(month.year, month.month, 1, tzinfo=UTC))
    spent = {
        "usage": await _spent(session, caller, since, max(tomorrow, month_end)),
        "usage_daily": await _spent(session, caller, today, tomorrow),
        "usage_weekly": await _spent(session, caller, week, week + timedelta(days=7)),
        "usage_monthly": await _spent(session, caller, month, month_end),
    }
    limits = await key_limits(session=session, tenant_id=caller.tenant_id, api_key_id=caller.api_key_id, now=now)
    tightest = min(limits, key=lambda s: s.remaining_pico or 0, default=None)
    limit = tightest.limit_pico if tightest else None
    remaining = tightest.remaining_pico if tightest else None
    info = KeyInfo(
        id=key.id,
        label=f"{key.prefix}...",
        name=key.name,
        scopes=list(caller.scopes),
        **{name: usd_float(pico) for name, pico in spent.items()},
        limit=None if limit is None else usd_float(limit),
        limit_remaining=None if remaining is None else usd_float(remaining),
        limit_reset=None if tightest is None or tightest.scope == "tenant_credit" else "monthly",
        limit_scope=tightest.scope if tightest else None,  # type: ignore[arg-type]
        expires_at=key.expires_at,
        rate_limit=RateLimit(
            requests=caller.requests_per_minute or _server_default(request, "default_requests_per_minute"),
            input_tokens=caller.input_tokens_per_minute or _server_default(request, "default_input_tokens_per_minute"),
        ),
        usd=KeyUsd(
            **{name: usd(pico) for name, pico in spent.items()},
            limit=None if limit is None else usd(limit),
            limit_remaining=None if remaining is None else usd(remaining),
        ),
    )
    return KeyInfoOut(data=info)
