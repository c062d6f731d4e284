"""Billing test fixtures: a migrated throwaway database on SQLite and on PostgreSQL.

Every test that takes `sessions` runs once per backend. PostgreSQL is skipped only
when nothing answers at 127.0.0.1:5432; each test session creates its own database
there and drops it at the end. Tests isolate by creating their own tenants, since
the ledger's triggers forbid deleting rows.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import catalog
from billing.pricebook import PriceBook
from billing.prices import PriceSpec, load_price_file
from kvgate.db import migrate, open_database
from kvgate.tenancy import ApiKey, Tenant
from tests.gateway.harness import free_port, pg_reachable, postgres_database

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with postgres_database(prefix="kvgate_billing_test") as url:
        migrate(url)
        yield url


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path: Path = tmp_path_factory.mktemp("billing-db") / "billing.db"
    url = f"sqlite:///{path}"
    migrate(url)
    return url


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(scope="session")
async def sessions(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    async with open_database(db_url) as factory:
        yield factory


@pytest.fixture(scope="session")
async def pricebook(sessions: async_sessionmaker[AsyncSession]) -> PriceBook:
    """Test prices: 'm-test' at $3/$15 per Mtok (24h writes at 1.5x), plus the real seed file
    (its '*' fallback is $0.10/$0.40), which the gateway under test seeds into the same database."""
    specs = [
        *load_price_file(),
        PriceSpec(
            model="m-test",
            effective_from=T0,
            input_usd_per_mtok=Decimal(3),
            output_usd_per_mtok=Decimal(15),
            cache_write_24h_multiplier=Decimal("1.5"),
        ),
    ]
    async with sessions() as session:
        await catalog.seed_prices(session=session, specs=specs, source="tests")
        await session.commit()
        return await catalog.load_pricebook(session=session)


async def make_tenant(sessions: async_sessionmaker[AsyncSession], *, keys: int = 1) -> tuple[str, list[str]]:
    """A fresh tenant (and keys) for one test; ids are unique so tests never share rows."""
    tenant_id = f"ten_{uuid.uuid4().hex[:16]}"
    key_ids = [f"key_{uuid.uuid4().hex[:16]}" for _ in range(keys)]
    async with sessions() as session:
        session.add(Tenant(id=tenant_id, name=f"Tenant {tenant_id[-4:]}", status="active"))
        await session.flush()
        for key_id in key_ids:
            session.add(
                ApiKey(id=key_id, tenant_id=tenant_id, name="test", key_hash=uuid.uuid4().hex * 2, prefix="kvg-test")
            )
        await session.commit()
    return tenant_id, key_ids


@pytest.fixture(scope="session")
def localstripe_url() -> Iterator[str]:
    """localstripe (with tests/billing/localstripe_server.py's two additions) on a free loopback port."""
    import subprocess
    import sys
    import time

    import httpx

    from kvgate import REPO_ROOT

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.billing.localstripe_server", "--port", str(port)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/v1/customers", auth=("sk_test_kvgate", ""), timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"localstripe did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
