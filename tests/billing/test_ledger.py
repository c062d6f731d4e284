"""The ledger: one entry per request id, reversals, late records, append-only storage."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from billing.ledger import LedgerError, UsageCharge
from billing.models import Invoice, LedgerEntry
from billing.settlement import reverse_charge, settle_charge
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant

NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)


def charge(tenant_id: str, key_id: str, request_id: str, **kw) -> UsageCharge:
    counts = kw.pop("counts", TokenCounts(input=100, cache_write_5m=2000, cache_read=5000, output=50))
    return UsageCharge(
        request_id=request_id,
        tenant_id=tenant_id,
        api_key_id=key_id,
        model=kw.pop("model", "m-test"),
        endpoint="messages",
        status="ok",
        started_at=kw.pop("started_at", NOW),
        counts=counts,
        ttft_ms=5,
        latency_ms=20,
    )


async def settle(sessions, pricebook, c: UsageCharge, now=NOW):
    async with sessions() as session:
        version = pricebook.price_for(c.model, c.started_at)
        result = await settle_charge(session=session, charge=c, version=version, source="live", now=now)
        await session.commit()
        return result


async def test_same_usage_twice_is_one_entry(sessions, pricebook):
    tenant, (key,) = await make_tenant(sessions)
    c = charge(tenant, key, f"req-{tenant}")
    first = await settle(sessions, pricebook, c)
    second = await settle(sessions, pricebook, c)
    assert first.inserted and not second.inserted
    assert first.entry_id == second.entry_id and first.cost_pico == second.cost_pico
    # 100*3 + 2000*3.75 + 5000*0.3 + 50*15 = 300 + 7500 + 1500 + 750 = 10,050 micro-dollars.
    assert first.cost_pico == 10_050 * 10**6
    async with sessions() as session:
        rows = await session.scalar(select(func.count()).where(LedgerEntry.tenant_id == tenant))
    assert rows == 1


async def test_unknown_model_is_priced_by_the_fallback(sessions, pricebook):
    tenant, (key,) = await make_tenant(sessions)
    result = await settle(
        sessions,
        pricebook,
        charge(tenant, key, f"req-{tenant}", model="other", counts=TokenCounts(input=1000, output=1000)),
    )
    assert result.cost_pico == (1000 * 100_000 + 1000 * 400_000)  # '*': $0.10 / $0.40 per Mtok


async def test_reversal_negates_and_is_idempotent(sessions, pricebook):
    tenant, (key,) = await make_tenant(sessions)
    original = await settle(sessions, pricebook, charge(tenant, key, f"req-{tenant}"))
    async with sessions() as session:
        reversal = await reverse_charge(session=session, request_id=f"req-{tenant}", reason="test", now=NOW)
        again = await reverse_charge(session=session, request_id=f"req-{tenant}", reason="test", now=NOW)
        await session.commit()
    assert reversal.inserted and not again.inserted
    assert reversal.cost_pico == -original.cost_pico
    async with sessions() as session:
        net = await session.scalar(select(func.sum(LedgerEntry.cost_pico)).where(LedgerEntry.tenant_id == tenant))
        tokens = await session.scalar(
            select(func.sum(LedgerEntry.cache_read_tokens)).where(LedgerEntry.tenant_id == tenant)
        )
        with pytest.raises(LedgerError):
            await reverse_charge(session=session, request_id="no-such-request", reason="x", now=NOW)
    assert net == 0 and tokens == 0


async def test_late_record_for_a_finalized_month_goes_to_the_current_month(sessions, pricebook):
    tenant, (key,) = await make_tenant(sessions)
    february = datetime(2026, 2, 27, tzinfo=UTC)
    on_time = await settle(sessions, pricebook, charge(tenant, key, f"a-{tenant}", started_at=february))
    assert on_time.billing_month == date(2026, 2, 1)
    async with sessions() as session:
        await session.execute(
            text("UPDATE invoices SET status = 'finalized', number = :n WHERE tenant_id = :t"),
            {"n": f"T-{tenant}", "t": tenant},
        )
        await session.commit()
    late = await settle(sessions, pricebook, charge(tenant, key, f"b-{tenant}", started_at=february))
    assert late.billing_month == date(2026, 3, 1)
    async with sessions() as session:
        months = (await session.scalars(select(Invoice.period_start).where(Invoice.tenant_id == tenant))).all()
    assert sorted(months) == [date(2026, 2, 1), date(2026, 3, 1)]


async def test_ledger_rows_cannot_be_updated_or_deleted(sessions, pricebook):
    tenant, (key,) = await make_tenant(sessions)
    await settle(sessions, pricebook, charge(tenant, key, f"req-{tenant}"))
    for statement in (
        "UPDATE ledger_entries SET cost_pico = 0 WHERE tenant_id = :t",
        "DELETE FROM ledger_entries WHERE tenant_id = :t",
    ):
        async with sessions() as session:
            with pytest.raises(DBAPIError, match="append-only"):
                await session.execute(text(statement), {"t": tenant})
    # Positive control: the same session can still append.
    assert (await settle(sessions, pricebook, charge(tenant, key, f"req2-{tenant}"))).inserted


def test_bad_charges_are_refused():
    with pytest.raises(LedgerError, match="negative"):
        charge("t", "k", "r", counts=TokenCounts(input=-1))
    with pytest.raises(LedgerError, match="request_id"):
        charge("t", "k", "")
    assert charge("t", "k", "r").counts.prompt_tokens == 7100
