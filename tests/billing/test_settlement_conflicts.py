"""Settlements that lose transaction races (deadlocks, serialization failures, SQLite's busy lock), on
SQLite and PostgreSQL:

- a conflict injected into a live settlement (the drivers' own exception types) is retried and lands;
- one that keeps failing goes to the spool, is replayed without a restart, and counts once;
- on PostgreSQL, a real deadlock (a second session locking the counters in the opposite order) is
  detected, retried and lands;
- a spool replay of several tenants, with live settlements (some with reservations) for the same
  tenants running meanwhile, leaves every request with exactly one ledger entry, and every
  budget counter equal to the sum of its entries (nothing lost, nothing counted twice).
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from typing import Any

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import budgets, spool_records
from billing.ledger import UsageCharge
from billing.models import BudgetReservation, KeyBudget, LedgerEntry, TenantBudget
from billing.periods import month_start, period_key
from billing.service import BillingService
from billing.settings import BillingSettings
from kvgate.db import utcnow
from kvgate.db_health import DatabaseHealth, is_transaction_conflict
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant

MODEL = "m-test"


def conflict_error(dialect: str) -> sa_exc.DBAPIError:
    """The exception SQLAlchemy raises for a lost race, around the driver's own exception type."""
    if dialect == "postgresql":
        return sa_exc.DBAPIError("COMMIT", {}, asyncpg.exceptions.DeadlockDetectedError("deadlock detected"))
    return sa_exc.OperationalError("COMMIT", {}, sqlite3.OperationalError("database is locked"))


class FlakySessions:
    """The real session factory, whose commits fail with `error` while `failures` lasts."""

    def __init__(self, inner: async_sessionmaker[AsyncSession], error: BaseException, failures: int) -> None:
        self.inner = inner
        self.error = error
        self.failures = failures

    def __call__(self) -> AsyncSession:
        session = self.inner()
        real_commit = session.commit

        async def commit() -> None:
            if self.failures > 0:
                self.failures -= 1
                raise self.error
            await real_commit()

        session.commit = commit  # type: ignore[method-assign]
        return session


def service_for(sessions: Any, pricebook, tmp_path, *, health: DatabaseHealth | None = None) -> BillingService:
    settings = BillingSettings(spool_path=tmp_path / "spool.jsonl", auto_finalize_invoices=False)
    return BillingService(sessions=sessions, settings=settings, pricebook=pricebook, health=health or DatabaseHealth())


def charge(tenant: str, key: str | None, request_id: str | None = None, output: int = 7) -> UsageCharge:
    return UsageCharge(
        request_id=request_id or f"req_{uuid.uuid4().hex[:20]}",
        tenant_id=tenant,
        api_key_id=key,
        model=MODEL,
        endpoint="messages",
        status="ok",
        started_at=utcnow(),
        counts=TokenCounts(input=100, output=output),
    )


async def entries(sessions, request_id: str) -> int:
    async with sessions() as session:
        return await session.scalar(select(func.count()).where(LedgerEntry.request_id == request_id))


async def check_tenant_books(sessions, tenant: str, request_ids: list[str]) -> None:
    """One entry per request; the month's spend counters equal the sum of the tenant's entries."""
    async with sessions() as session:
        rows = (
            await session.execute(
                select(LedgerEntry.request_id, func.count())
                .where(LedgerEntry.tenant_id == tenant)
                .group_by(LedgerEntry.request_id)
            )
        ).all()
        total = await session.scalar(select(func.sum(LedgerEntry.cost_pico)).where(LedgerEntry.tenant_id == tenant))
        status = await budgets.budget_status(session=session, tenant_id=tenant)
        left = await session.scalar(select(func.count()).where(BudgetReservation.tenant_id == tenant))
    assert dict(rows) == dict.fromkeys(request_ids, 1)
    assert status.month.spent_pico == total and status.credit.spent_pico == total
    assert status.month.reserved_pico == 0 and left == 0


async def test_a_conflict_in_a_live_settlement_is_retried_and_lands(sessions, pricebook, tmp_path):
    dialect = sessions.kw["bind"].dialect.name
    tenant, (key,) = await make_tenant(sessions)
    flaky = FlakySessions(sessions, conflict_error(dialect), failures=2)
    service = service_for(flaky, pricebook, tmp_path)
    assert is_transaction_conflict(flaky.error)
    c = charge(tenant, key)
    outcome = await service.settle(c)
    assert not outcome.spooled and flaky.failures == 0
    assert service.metrics.conflicts.labels(outcome="retried")._value.get() == 2
    assert await entries(sessions, c.request_id) == 1
    assert not service.spool.has_pending() and service.health.available
    await check_tenant_books(sessions, tenant, [c.request_id])


async def test_a_settlement_that_keeps_losing_goes_to_the_spool_and_is_replayed_once(sessions, pricebook, tmp_path):
    dialect = sessions.kw["bind"].dialect.name
    tenant, (key,) = await make_tenant(sessions)
    flaky = FlakySessions(sessions, conflict_error(dialect), failures=1000)
    service = service_for(flaky, pricebook, tmp_path)
    c = charge(tenant, key)
    outcome = await service.settle(c)
    assert outcome.spooled and service.spool.pending() == 1
    assert service.metrics.conflicts.labels(outcome="spooled")._value.get() == 1
    # A lost race is not an outage: the next request still goes to the database first.
    assert service.health.available
    assert await entries(sessions, c.request_id) == 0

    flaky.failures = 0  # the contention is over: the upkeep's next replay lands it, no restart
    result = await service.replay_spool()
    assert (result.records, result.applied) == (1, 1)
    assert await entries(sessions, c.request_id) == 1
    # Settling it again (a retry, the spooled copy of a late commit) adds nothing.
    again = await service.settle(c)
    assert again.duplicate
    await check_tenant_books(sessions, tenant, [c.request_id])


async def test_a_real_deadlock_is_retried_and_lands(sessions, pricebook, tmp_path):
    if sessions.kw["bind"].dialect.name != "postgresql":
        pytest.skip("row-lock deadlocks are PostgreSQL's (SQLite has one write lock)")
    tenant, (key,) = await make_tenant(sessions)
    service = service_for(sessions, pricebook, tmp_path)
    period = period_key(month_start(utcnow()))
    key_month = budgets.CounterKey(budgets.KEY_MONTH, key, period)
    credit = budgets.CounterKey(budgets.TENANT_CREDIT, tenant, budgets.ALL_TIME)
    async with sessions() as session:
        await budgets.lock_counters(session=session, counters=[key_month, credit])
        await session.commit()

    holder_error: list[BaseException] = []
    async with sessions() as holder:
        # The other order: the tenant's credit counter first, then the key's.
        await budgets.lock_counters(session=holder, counters=[credit])
        settling = asyncio.create_task(service.settle(charge(tenant, key)))
        await asyncio.sleep(0.5)  # the settlement holds the key's counter and waits for the credit one
        try:
            await budgets.lock_counters(session=holder, counters=[key_month])
            await asyncio.sleep(0.2)
        except sa_exc.DBAPIError as error:  # PostgreSQL may pick either side as the victim
            holder_error.append(error)
        await holder.rollback()
        outcome = await asyncio.wait_for(settling, 30)
    assert not outcome.spooled
    retried = service.metrics.conflicts.labels(outcome="retried")._value.get()
    # Exactly one side lost the deadlock; when it was the settlement, it was retried and landed.
    assert (retried >= 1) != bool(holder_error and is_transaction_conflict(holder_error[0])), (retried, holder_error)
    async with sessions() as session:
        count = await session.scalar(select(func.count()).where(LedgerEntry.tenant_id == tenant))
    assert count == 1


async def test_replaying_many_tenants_while_live_settlements_run_counts_each_request_once(
    sessions, pricebook, tmp_path
):
    service = service_for(sessions, pricebook, tmp_path)
    tenants = [await make_tenant(sessions, keys=2) for _ in range(4)]
    async with sessions() as session:
        for tenant, keys in tenants:
            # A tenant limit and no key limit: a reservation holds the tenant's month counter only,
            # while the spend moves the key's too (the order that used to deadlock).
            session.add(TenantBudget(tenant_id=tenant, monthly_limit_pico=10**15, prepaid=False))
            session.add(KeyBudget(api_key_id=keys[1], tenant_id=tenant, monthly_limit_pico=10**15))
        await session.commit()
    expected: dict[str, list[str]] = {tenant: [] for tenant, _ in tenants}
    # Spooled earlier (an outage), interleaved across tenants as requests came.
    for i in range(60):
        tenant, keys = tenants[i % len(tenants)]
        c = charge(tenant, keys[i % 2], output=i + 1)
        version = service.price_for(c.model, c.started_at)
        service.spool.append(spool_records.spool_record(c, version))
        expected[tenant].append(c.request_id)
    # One of them twice (a spooled copy of a settlement that also committed late).
    tenant0, keys0 = tenants[0]
    late = charge(tenant0, keys0[0])
    service.spool.append(spool_records.spool_record(late, service.price_for(MODEL, late.started_at)))
    await service.settle(late)
    expected[tenant0].append(late.request_id)

    async def live(tenant: str, keys: list[str], n: int) -> None:
        for i in range(n):
            c = charge(tenant, keys[(i + 1) % 2], output=3 + i)
            await service.admit(
                request_id=c.request_id,
                tenant_id=tenant,
                api_key_id=c.api_key_id,
                model=MODEL,
                prompt_tokens=100,
                max_output_tokens=50,
            )
            outcome = await service.settle(c)
            assert not outcome.spooled or service.spool.has_pending()
            expected[tenant].append(c.request_id)

    replay = asyncio.create_task(service.replay_spool())
    await asyncio.gather(*(live(tenant, keys, 8) for tenant, keys in tenants), replay)
    while service.spool.has_pending():  # anything a lost race spooled meanwhile
        await service.replay_spool()
    for tenant, _ in tenants:
        await check_tenant_books(sessions, tenant, expected[tenant])
    assert service.metrics.replayed.labels(outcome="rejected")._value.get() == 0


async def test_a_timed_out_settlement_is_spooled_and_its_late_commit_counts_once(sessions, pricebook, tmp_path):
    """write_timeout_s: a settlement slower than it goes to the spool; the slow one still commits,
    and the replay of its spooled copy finds the entry and adds nothing."""
    tenant, (key,) = await make_tenant(sessions)
    gate = asyncio.Event()

    class SlowSessions(FlakySessions):
        def __call__(self) -> AsyncSession:
            session = self.inner()
            real_commit = session.commit

            async def commit() -> None:
                await gate.wait()
                await real_commit()

            session.commit = commit  # type: ignore[method-assign]
            return session

    service = service_for(SlowSessions(sessions, RuntimeError(), 0), pricebook, tmp_path)
    service.write_timeout_s = 0.3
    c = charge(tenant, key)
    started = asyncio.get_running_loop().time()
    outcome = await service.settle(c)
    assert outcome.spooled and asyncio.get_running_loop().time() - started < 2
    assert not service.health.available  # a stalled write trips the outage switch, as a failed one does
    gate.set()
    late = next(iter(service._late))
    await asyncio.wait_for(late, 10)
    assert await entries(sessions, c.request_id) == 1
    service.health.succeeded()
    service.sessions = sessions
    result = await service.replay_spool()
    assert (result.records, result.applied) == (1, 0)
    await check_tenant_books(sessions, tenant, [c.request_id])


def test_conflicts_are_told_apart_from_outages():
    assert is_transaction_conflict(conflict_error("postgresql"))
    assert is_transaction_conflict(conflict_error("sqlite"))
    serialization = sa_exc.DBAPIError("UPDATE", {}, asyncpg.exceptions.SerializationError("could not serialize"))
    assert is_transaction_conflict(serialization)
    assert not is_transaction_conflict(sa_exc.OperationalError("x", {}, sqlite3.OperationalError("disk I/O error")))
    assert not is_transaction_conflict(TimeoutError())
    assert not is_transaction_conflict(ValueError("database is locked"))
