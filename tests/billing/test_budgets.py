"""Budgets: refusal before the engine runs, reservations, settlement, and 50 concurrent requests."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from billing import budget_limits, budgets
from billing.budgets import BudgetExceededError
from billing.ledger import UsageCharge
from billing.models import BudgetCounter, BudgetReservation, LedgerEntry
from billing.service import BillingService
from billing.settings import BillingSettings
from kvgate.db import create_engine, session_factory
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant

NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)
# A request with regions of both of Anthropic's TTLs, as the tests' reservations assume.
ANTHROPIC_TTLS = (300, 3600)
MICRO = 10**6  # pico-dollars per micro-dollar


def service(sessions, pricebook, tmp_path) -> BillingService:
    settings = BillingSettings(spool_path=tmp_path / "spool.jsonl")
    return BillingService(sessions=sessions, settings=settings, pricebook=pricebook, clock=lambda: NOW)


def charge(tenant, key, request_id, counts) -> UsageCharge:
    return UsageCharge(
        request_id=request_id,
        tenant_id=tenant,
        api_key_id=key,
        model="m-test",
        endpoint="messages",
        status="ok",
        started_at=NOW,
        counts=counts,
        latency_ms=1,
    )


async def set_limit(sessions, tenant, micro_usd, *, prepaid=None):
    async with sessions() as session:
        await budget_limits.set_tenant_budget(
            session=session, tenant_id=tenant, monthly_limit_pico=micro_usd * MICRO, prepaid=prepaid
        )
        await session.commit()


async def test_estimate_is_prompt_at_the_write_price_plus_max_output(sessions, pricebook, tmp_path):
    svc = service(sessions, pricebook, tmp_path)

    def estimate(write_ttls_s: tuple[int, ...] | None) -> int:
        return svc.estimate_pico(
            model="m-test", prompt_tokens=1000, max_output_tokens=100, at=NOW, write_ttls_s=write_ttls_s
        )

    # m-test: $3 in, $15 out. A request with 5m and 1h regions can be billed at most the 1h write
    # rate ($6); one with only a 5m region at $3.75; one writing nothing at the input rate.
    assert estimate(ANTHROPIC_TTLS) == (1000 * 6 + 100 * 15) * MICRO
    assert estimate((300,)) == (3_750 + 100 * 15) * MICRO
    assert estimate(()) == (1000 * 3 + 100 * 15) * MICRO
    # Unknown regions: the dearest class there is, the 12h write at 5x ($15).
    assert estimate(None) == (1000 * 15 + 100 * 15) * MICRO


async def test_refused_when_the_limit_cannot_cover_the_reservation(sessions, pricebook, tmp_path):
    svc = service(sessions, pricebook, tmp_path)
    tenant, (key,) = await make_tenant(sessions)
    await set_limit(sessions, tenant, 7_500)  # exactly one 1000-in/100-out reservation
    first = await svc.admit(
        request_id=f"a-{tenant}",
        tenant_id=tenant,
        api_key_id=key,
        model="m-test",
        prompt_tokens=1000,
        max_output_tokens=100,
        write_ttls_s=ANTHROPIC_TTLS,
    )
    assert first is not None and first.amount_pico == 7_500 * MICRO
    with pytest.raises(BudgetExceededError, match="monthly spend limit") as refused:
        await svc.admit(
            request_id=f"b-{tenant}",
            tenant_id=tenant,
            api_key_id=key,
            model="m-test",
            prompt_tokens=1000,
            max_output_tokens=100,
            write_ttls_s=ANTHROPIC_TTLS,
        )
    assert refused.value.reserved_pico == 7_500 * MICRO
    # Settling the first at its real cost frees the difference for the next request.
    outcome = await svc.settle(charge(tenant, key, f"a-{tenant}", TokenCounts(cache_write_5m=1000, output=10)))
    assert outcome.cost_pico == (3750 + 150) * MICRO
    async with sessions() as session:
        status = await budgets.budget_status(session=session, tenant_id=tenant, now=NOW)
    assert status.month.reserved_pico == 0 and status.month.spent_pico == outcome.cost_pico
    assert status.month.remaining_pico == 7_500 * MICRO - outcome.cost_pico
    smaller = await svc.admit(
        request_id=f"c-{tenant}",
        tenant_id=tenant,
        api_key_id=key,
        model="m-test",
        prompt_tokens=100,
        max_output_tokens=10,
        write_ttls_s=ANTHROPIC_TTLS,
    )
    assert smaller is not None


async def test_no_limit_means_no_reservation(sessions, pricebook, tmp_path):
    svc = service(sessions, pricebook, tmp_path)
    tenant, (key,) = await make_tenant(sessions)
    assert (
        await svc.admit(
            request_id=f"a-{tenant}",
            tenant_id=tenant,
            api_key_id=key,
            model="m-test",
            prompt_tokens=10**6,
            max_output_tokens=10**6,
            write_ttls_s=ANTHROPIC_TTLS,
        )
        is None
    )
    await svc.settle(charge(tenant, key, f"a-{tenant}", TokenCounts(input=10)))
    async with sessions() as session:
        status = await budgets.budget_status(session=session, tenant_id=tenant, now=NOW)
    assert status.month.spent_pico == 30 * MICRO  # spend is counted even without a limit


async def test_key_limit_and_prepaid_credit(sessions, pricebook, tmp_path):
    svc = service(sessions, pricebook, tmp_path)
    tenant, (key_a, key_b) = await make_tenant(sessions, keys=2)
    async with sessions() as session:
        await budget_limits.set_key_budget(session=session, tenant_id=tenant, api_key_id=key_a, monthly_limit_pico=0)
        await session.commit()
    with pytest.raises(BudgetExceededError, match="API key"):
        await svc.admit(
            request_id=f"a-{tenant}",
            tenant_id=tenant,
            api_key_id=key_a,
            model="m-test",
            prompt_tokens=1,
            max_output_tokens=1,
            write_ttls_s=ANTHROPIC_TTLS,
        )
    assert (
        await svc.admit(
            request_id=f"b-{tenant}",
            tenant_id=tenant,
            api_key_id=key_b,
            model="m-test",
            prompt_tokens=1,
            max_output_tokens=1,
            write_ttls_s=ANTHROPIC_TTLS,
        )
        is None
    )
    await svc.settle(charge(tenant, key_b, f"b-{tenant}", TokenCounts(input=1)))
    # Prepaid with no credit: refused; a grant lets requests through up to the balance.
    async with sessions() as session:
        await budget_limits.set_tenant_budget(session=session, tenant_id=tenant, monthly_limit_pico=None, prepaid=True)
        await session.commit()
    with pytest.raises(BudgetExceededError, match="prepaid credit"):
        await svc.admit(
            request_id=f"c-{tenant}",
            tenant_id=tenant,
            api_key_id=key_b,
            model="m-test",
            prompt_tokens=1,
            max_output_tokens=1,
            write_ttls_s=ANTHROPIC_TTLS,
        )
    async with sessions() as session:
        _, created = await budget_limits.grant_credit(
            session=session, tenant_id=tenant, amount_pico=100 * MICRO, note="top-up", idempotency_key=f"grant-{tenant}"
        )
        _, again = await budget_limits.grant_credit(
            session=session, tenant_id=tenant, amount_pico=100 * MICRO, note="top-up", idempotency_key=f"grant-{tenant}"
        )
        await session.commit()
        status = await budgets.budget_status(session=session, tenant_id=tenant, now=NOW)
    assert created and not again and status.credit_granted_pico == 100 * MICRO
    # 3 µ$ already spent, so 97 µ$ remain: 4 prompt tokens at 6 + 4 output at 15 = 84 fits, 5 + 5 = 105 not.
    assert status.credit.remaining_pico == 97 * MICRO
    with pytest.raises(BudgetExceededError):
        await svc.admit(
            request_id=f"d-{tenant}",
            tenant_id=tenant,
            api_key_id=key_b,
            model="m-test",
            prompt_tokens=5,
            max_output_tokens=5,
            write_ttls_s=ANTHROPIC_TTLS,
        )
    assert (
        await svc.admit(
            request_id=f"e-{tenant}",
            tenant_id=tenant,
            api_key_id=key_b,
            model="m-test",
            prompt_tokens=4,
            max_output_tokens=4,
            write_ttls_s=ANTHROPIC_TTLS,
        )
        is not None
    )


async def test_fifty_concurrent_requests_never_overrun(db_url, pricebook, tmp_path):
    """50 requests race on one tenant's limit; each admitted one settles at a random real cost."""
    engine = (
        create_engine(db_url, pool_size=25, max_overflow=0)
        if db_url.startswith("postgresql")
        else (create_engine(db_url))
    )
    sessions = session_factory(engine)
    try:
        svc = service(sessions, pricebook, tmp_path)
        tenant, (key,) = await make_tenant(sessions)
        reservation_micro = 200 * 6 + 50 * 15  # 1,950 µ$ per request
        limit_micro = 20 * reservation_micro + 1000  # room for 20 reservations at a time, not 21
        await set_limit(sessions, tenant, limit_micro)
        rng = random.Random(7)
        plans = [
            TokenCounts(
                input=rng.randint(0, 50),
                cache_write_5m=rng.randint(0, 100),
                cache_read=rng.randint(0, 50),
                output=rng.randint(1, 50),
            )
            for _ in range(50)
        ]
        observed_overrun = []

        async def one(i: int) -> int | None:
            rid = f"r{i}-{tenant}"
            try:
                await svc.admit(
                    request_id=rid,
                    tenant_id=tenant,
                    api_key_id=key,
                    model="m-test",
                    prompt_tokens=200,
                    max_output_tokens=50,
                    write_ttls_s=ANTHROPIC_TTLS,
                )
            except BudgetExceededError:
                return None
            await asyncio.sleep(rng.random() * 0.05)  # the engine runs
            async with sessions() as session:
                row = await session.scalar(
                    select(BudgetCounter).where(BudgetCounter.scope == "tenant_month", BudgetCounter.owner_id == tenant)
                )
                if row.spent_pico + row.reserved_pico > limit_micro * MICRO:
                    observed_overrun.append(row)
            outcome = await svc.settle(charge(tenant, key, rid, plans[i]))
            return outcome.cost_pico

        costs = await asyncio.gather(*(one(i) for i in range(50)))
        admitted = [c for c in costs if c is not None]
        expected = sum(
            pricebook.price_for("m-test", NOW).cost_pico(plans[i]) for i, c in enumerate(costs) if c is not None
        )
        async with sessions() as session:
            entries = await session.scalar(select(func.count()).where(LedgerEntry.tenant_id == tenant))
            total = await session.scalar(select(func.sum(LedgerEntry.cost_pico)).where(LedgerEntry.tenant_id == tenant))
            counter = await session.scalar(
                select(BudgetCounter).where(BudgetCounter.scope == "tenant_month", BudgetCounter.owner_id == tenant)
            )
            left = await session.scalar(select(func.count()).where(BudgetReservation.tenant_id == tenant))
        assert entries == len(admitted) and total == sum(admitted) == expected
        assert counter.spent_pico == total and counter.reserved_pico == 0 and left == 0
        assert counter.spent_pico <= limit_micro * MICRO and not observed_overrun
        assert len(admitted) >= 20  # at least the first 20 fit; more once early ones settle
    finally:
        await engine.dispose()


async def test_fifty_concurrent_requests_all_admitted_give_fifty_entries(db_url, pricebook, tmp_path):
    engine = (
        create_engine(db_url, pool_size=25, max_overflow=0)
        if db_url.startswith("postgresql")
        else (create_engine(db_url))
    )
    sessions = session_factory(engine)
    try:
        svc = service(sessions, pricebook, tmp_path)
        tenant, (key,) = await make_tenant(sessions)
        await set_limit(sessions, tenant, 10**9)
        counts = [TokenCounts(input=i, cache_write_1h=2 * i, cache_read=3 * i, output=i + 1) for i in range(50)]

        async def one(i: int) -> int:
            rid = f"r{i}-{tenant}"
            await svc.admit(
                request_id=rid,
                tenant_id=tenant,
                api_key_id=key,
                model="m-test",
                prompt_tokens=6 * i,
                max_output_tokens=i + 1,
                write_ttls_s=ANTHROPIC_TTLS,
            )
            return (await svc.settle(charge(tenant, key, rid, counts[i]))).cost_pico

        costs = await asyncio.gather(*(one(i) for i in range(50)))
        # Independent total: Σ i*3 + 2i*6 + 3i*0.3 + (i+1)*15 µ$ = Σ (30.9 i + 15) µ$ = 38,602.5 µ$.
        expected_micro = sum(Decimal("30.9") * i + 15 for i in range(50))
        assert expected_micro == Decimal("38602.5")
        async with sessions() as session:
            entries = await session.scalar(select(func.count()).where(LedgerEntry.tenant_id == tenant))
            total = await session.scalar(select(func.sum(LedgerEntry.cost_pico)).where(LedgerEntry.tenant_id == tenant))
        assert entries == 50 and total == sum(costs) == int(expected_micro * MICRO)
    finally:
        await engine.dispose()
