"""Usage for the dashboard's tests, written by billing's own ledger writer (settle_charge), so the
ledger, the hourly rollups and the invoice drafts are filled exactly as the gateway fills them.

The charges are deterministic: every day of a month gets a few requests over two keys, two models
and both APIs, with cache writes (of every standard TTL class, in turn), reads and an occasional
error, and one reversal.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import catalog
from billing.ledger import UsageCharge, reverse_usage
from billing.periods import month_bounds
from billing.settlement import settle_charge
from kvgate.usage import TTL_CLASSES, TokenCounts

ENDPOINTS = ("messages", "chat.completions")
# Long prompts, as prompt caching is for: tens of thousands of tokens a request.
SCALE = 1000
# The classes every deployment prices, from the TTL table: a new class is seeded without a change here.
WRITE_CLASSES = tuple(t for t in TTL_CLASSES if t.standard)


@dataclass(frozen=True)
class SeededMonth:
    month: date
    charges: list[UsageCharge]
    reversed_request_id: str

    @property
    def days(self) -> int:
        start, end = month_bounds(self.month)
        return (end - start).days


def charges_for(
    *, tenant_id: str, key_ids: list[str], models: list[str], month: date, until: datetime | None = None
) -> list[UsageCharge]:
    """The month's charges (those that started before `until`, when given)."""
    start, end = month_bounds(month)
    charges, day, n = [], start, 0
    while day < end:
        for i in range(1 + day.day % 3):
            n += 1
            cached = n % 4 != 0
            writes = dict.fromkeys((t.category.value for t in TTL_CLASSES), 0)
            if cached and n % 3 != 2:
                writes[WRITE_CLASSES[(n // 3) % len(WRITE_CLASSES)].category.value] = SCALE * (96 - 32 * (n % 3))
            counts = TokenCounts(
                input=SCALE * (40 + 7 * n % 90),
                cache_read=0 if not cached else SCALE * (128 + 16 * (n % 5)),
                output=5 * SCALE // 10 + n % 23,
                **writes,
            )
            charges.append(
                UsageCharge(
                    request_id=f"req_dash_{uuid.uuid4().hex[:20]}",
                    tenant_id=tenant_id,
                    api_key_id=key_ids[n % len(key_ids)],
                    model=models[(n // 2) % len(models)],
                    endpoint=ENDPOINTS[n % 2],
                    status="error" if n % 11 == 0 else "ok",
                    started_at=day + timedelta(hours=(3 + 5 * i + n) % 24, minutes=n % 60),
                    counts=counts,
                    latency_ms=100 + n,
                )
            )
        day += timedelta(days=1)
    return [c for c in charges if until is None or c.started_at < until]


async def seed_month(
    sessions: async_sessionmaker[AsyncSession],
    *,
    tenant_id: str,
    key_ids: list[str],
    models: list[str],
    month: date,
    until: datetime | None = None,
) -> SeededMonth:
    """Settle a month of charges (up to `until`) and reverse one, through billing's ledger writer."""
    charges = charges_for(tenant_id=tenant_id, key_ids=key_ids, models=models, month=month, until=until)
    async with sessions() as session:
        book = await catalog.load_pricebook(session=session)
        recorded_at = min(month_bounds(month)[1] - timedelta(minutes=1), until or datetime.max.replace(tzinfo=UTC))
        for charge in charges:
            version = book.price_for(charge.model, charge.started_at)
            await settle_charge(session=session, charge=charge, version=version, source="live", now=recorded_at)
        await session.commit()
        reversed_id = charges[len(charges) // 2].request_id
        await reverse_usage(session=session, request_id=reversed_id, reason="dashboard test", now=recorded_at)
        await session.commit()
    return SeededMonth(month=month, charges=charges, reversed_request_id=reversed_id)


def utc(year: int, month: int, day: int, hour: int = 0) -> datetime:
    return datetime(year, month, day, hour, tzinfo=UTC)
