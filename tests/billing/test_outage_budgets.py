"""Budgets while the database is away: admission from the last-known state, refused past each limit.

The database goes away for real on PostgreSQL (a proxy the test cuts); SQLite has no socket to cut,
so there the session factory refuses as a missing database file would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from billing import budget_limits, budgets
from billing.budgets import BudgetExceededError
from billing.ledger import UsageCharge
from billing.service import BillingService, BudgetUnavailableError
from billing.settings import BillingSettings
from kvgate.db import create_engine, session_factory
from kvgate.db_health import DatabaseHealth
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant
from tests.billing.tcp_proxy import CuttableProxy

NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)
MICRO = 10**6
# m-test ($3 in, $15 out): 1000 prompt tokens at the 1h write price and 100 out reserve 7,500 micro-USD;
# 1000 written for 5m and 10 out cost 3,900.
RESERVE = 7_500 * MICRO
COST = 3_900 * MICRO
COUNTS = TokenCounts(cache_write_5m=1000, output=10)


class Database:
    """The test database behind a switch: down() makes it unreachable, up() brings it back."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.proxy: CuttableProxy | None = None
        self.is_down = False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Any]:
        url = self.db_url
        if url.startswith("postgresql"):
            parsed = make_url(url)
            self.proxy = CuttableProxy(parsed.host or "127.0.0.1", parsed.port or 5432)
            await self.proxy.start()
            url = parsed.set(port=self.proxy.port).render_as_string(hide_password=False)
        engine = create_engine(url)
        self.real = session_factory(engine)
        try:
            yield self.sessions
        finally:
            await engine.dispose()
            if self.proxy is not None:
                await self.proxy.stop()

    def sessions(self) -> Any:
        if self.proxy is None and self.is_down:
            raise OperationalError("connect", {}, Exception("unable to open database file"))
        return self.real()

    def down(self) -> None:
        self.is_down = True
        if self.proxy is not None:
            self.proxy.cut()

    def up(self) -> None:
        self.is_down = False
        if self.proxy is not None:
            self.proxy.restore()


def request(tenant: str, key: str, request_id: str) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "tenant_id": tenant,
        "api_key_id": key,
        "model": "m-test",
        "prompt_tokens": 1000,
        "max_output_tokens": 100,
        "write_ttls_s": (300, 3600),  # regions of Anthropic's two TTLs: reserved at the 1h write rate
    }


def charge(tenant: str, key: str, request_id: str) -> UsageCharge:
    return UsageCharge(
        request_id=request_id,
        tenant_id=tenant,
        api_key_id=key,
        model="m-test",
        endpoint="messages",
        status="ok",
        started_at=NOW,
        counts=COUNTS,
        latency_ms=1,
    )


async def test_outage_admission_is_bounded_by_the_last_known_budget(db_url, pricebook, tmp_path):
    db = Database(db_url)
    async with db.running() as sessions:
        settings = BillingSettings(spool_path=tmp_path / "spool.jsonl")
        svc = BillingService(
            sessions=sessions,
            settings=settings,
            pricebook=pricebook,
            clock=lambda: NOW,
            health=DatabaseHealth(retry_interval_s=0),  # every call tries the database
        )
        limited, (lkey,) = await make_tenant(db.real)
        free, (fkey,) = await make_tenant(db.real)
        stranger, (skey,) = await make_tenant(db.real)
        limit = 4 * RESERVE
        async with db.real() as session:
            await budget_limits.set_tenant_budget(session=session, tenant_id=limited, monthly_limit_pico=limit)
            await session.commit()
        # Online: both tenants' budgets become known (the limited one holds 1 reservation then).
        assert await svc.admit(**request(limited, lkey, f"{limited}-0")) is not None
        assert (await svc.settle(charge(limited, lkey, f"{limited}-0"))).cost_pico == COST
        assert await svc.admit(**request(free, fkey, f"{free}-0")) is None

        db.down()
        admitted = 0
        with pytest.raises(BudgetExceededError, match="monthly spend limit"):
            for i in range(1, 20):
                await svc.admit(**request(limited, lkey, f"{limited}-{i}"))
                assert (await svc.settle(charge(limited, lkey, f"{limited}-{i}"))).spooled
                admitted += 1
        # Known at admission: 1 reservation. Then each outage request holds RESERVE while it runs and
        # counts COST once settled: RESERVE + COST * (k - 1) + RESERVE <= 4 * RESERVE admits k = 4.
        assert admitted == 4
        for i in range(1, 10):  # no limit: never refused
            await svc.admit(**request(free, fkey, f"{free}-{i}"))
            await svc.settle(charge(free, fkey, f"{free}-{i}"))
        with pytest.raises(BudgetUnavailableError):  # never admitted since start-up: budget unknown
            await svc.admit(**request(stranger, skey, f"{stranger}-1"))
        strict = BillingService(
            sessions=sessions,
            settings=settings.model_copy(update={"budget_fail_open": False}),
            pricebook=pricebook,
            clock=lambda: NOW,
            health=DatabaseHealth(retry_interval_s=0),
        )
        with pytest.raises(BudgetUnavailableError):
            await strict.admit(**request(free, fkey, f"{free}-strict"))

        db.up()
        # Back online, the spool not replayed yet: admission still counts the outage's spend.
        # Database: COST spent. Memory: 4 * COST. Room for one more reservation, not two.
        assert await svc.admit(**request(limited, lkey, f"{limited}-online-1")) is not None
        with pytest.raises(BudgetExceededError):
            await svc.admit(**request(limited, lkey, f"{limited}-online-2"))
        result = await svc.replay_spool()
        assert (result.records, result.applied) == (4 + 9, 4 + 9)
        async with db.real() as session:
            status = await budgets.budget_status(session=session, tenant_id=limited, now=NOW)
        assert status.month.spent_pico == 5 * COST and status.month.reserved_pico == RESERVE
        assert status.month.spent_pico + status.month.reserved_pico <= limit
