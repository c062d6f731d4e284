"""Gateway fixtures: migrated databases on SQLite and PostgreSQL, and running gateways.

`gateway` is one server for the session (SQLite, tiny Llama, minimum cacheable
length 64 tokens); tests isolate by creating their own tenants and keys.
PostgreSQL is skipped only when nothing answers at 127.0.0.1:5432.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from kvgate.db import migrate, open_database
from tests.gateway.harness import GatewayServer, pg_reachable, postgres_database


@pytest.fixture(scope="session")
def gw_postgres_url() -> Iterator[str]:
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with postgres_database() as url:
        yield url


@pytest.fixture(scope="session")
def gw_sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('gateway-db') / 'kvgate.db'}"


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def gw_db_url(request: pytest.FixtureRequest) -> str:
    url = request.getfixturevalue(f"gw_{request.param}_url")
    migrate(url)
    return url


@pytest.fixture(scope="session")
async def gw_sessions(gw_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    async with open_database(gw_db_url) as factory:
        yield factory


@pytest.fixture(scope="session")
def gateway(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('gateway-server') / 'kvgate.db'}"
    server = GatewayServer(model_dir=tiny_llama_dir, database_url=url).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_gateway(tiny_llama_dir: Path, gw_postgres_url: str) -> Iterator[GatewayServer]:
    server = GatewayServer(model_dir=tiny_llama_dir, database_url=gw_postgres_url).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_gateway(request: pytest.FixtureRequest) -> GatewayServer:
    """The gateway on each database backend (for admin, auth and usage-record tests)."""
    return request.getfixturevalue("gateway" if request.param == "sqlite" else "pg_gateway")
