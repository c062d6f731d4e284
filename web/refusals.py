"""Refused requests as the dashboard shows them: counted by the limit that refused them, in words, and listed
(usage records with status "refused", written by gateway/refusals.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from billing.budgets import KEY_MONTH, TENANT_CREDIT, TENANT_MONTH
from kvgate.tenancy import UsageRecord
from kvgate.usage import REFUSED

RATE_LIMIT = "rate_limit"  # kvgate.errors.RateLimitError.refusal
# Admission reserves a request's worst case (its prompt, and max_tokens at the output price) before it runs:
# a budget refuses a request whose worst case does not fit what spend and the requests in flight leave.
WORST_CASE = "its worst case (the prompt, and max_tokens at the output price) did not fit what was left"
REASON_WORDS = {
    RATE_LIMIT: "a key's rate limit (requests per minute)",
    TENANT_MONTH: f"the monthly budget: {WORST_CASE}",
    KEY_MONTH: f"a key's monthly budget: {WORST_CASE}",
    TENANT_CREDIT: f"the prepaid credit: {WORST_CASE}",
}
LISTED = 50


def reason_words(reason: str | None) -> str:
    return REASON_WORDS.get(reason or "", reason or "a limit")


@dataclass(frozen=True)
class RefusalCount:
    reason: str
    words: str
    requests: int


async def refusal_counts(
    session: AsyncSession, *, tenant_id: str, start: datetime, end: datetime
) -> list[RefusalCount]:
    """The tenant's refusals in [start, end) by reason, most first."""
    rows = await session.execute(
        select(UsageRecord.refusal_reason, func.count())
        .where(
            UsageRecord.tenant_id == tenant_id,
            UsageRecord.status == REFUSED,
            UsageRecord.started_at >= start,
            UsageRecord.started_at < end,
        )
        .group_by(UsageRecord.refusal_reason)
    )
    counts = [RefusalCount(reason or "", reason_words(reason), int(n)) for reason, n in rows.all()]
    return sorted(counts, key=lambda c: (-c.requests, c.reason))


async def recent_refusals(
    session: AsyncSession, *, tenant_id: str, request_id: str | None = None, limit: int = LISTED
) -> list[UsageRecord]:
    """The tenant's latest refusals, newest first (or the one with this request id)."""
    query = select(UsageRecord).where(UsageRecord.tenant_id == tenant_id, UsageRecord.status == REFUSED)
    if request_id is not None:
        query = query.where(UsageRecord.request_id == request_id)
    return list(
        await session.scalars(query.order_by(UsageRecord.started_at.desc(), UsageRecord.request_id).limit(limit))
    )
