"""A tenant with a month of usage for the page tests: keys named alpha and beta, October 2026 written by
billing's ledger writer (two models, both APIs, cache writes and reads, errors, a reversal), and a
logged-in member's cookies."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, TypeVar

import httpx
import sqlalchemy as sa

from billing.periods import month_start
from kvgate.db import open_database
from kvgate.usage import Category
from tests.gateway.harness import GatewayServer
from tests.web.sessions import member_session
from tests.web.usage_data import SeededMonth, seed_month
from web.deps import SESSION_COOKIE

T = TypeVar("T")
OCTOBER = date(2026, 10, 1)
SECOND_MODEL = "SmolLM2-135M-Instruct"


@dataclass
class SeededTenant:
    server: GatewayServer
    tenant_id: str
    key_ids: dict[str, str]
    """name -> id"""
    month: SeededMonth
    cookies: dict[str, str]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.server.base_url, cookies=self.cookies, timeout=60)

    def browser_cookies(self) -> list[dict[str, Any]]:
        return [{"name": SESSION_COOKIE, "value": self.cookies[SESSION_COOKIE], "url": self.server.base_url}]

    def ledger_sums(self, where: str = "", **params: Any) -> dict[str, int]:
        """The tenant's ledger summed (every entry, reversals included) under an extra SQL condition."""
        columns = tuple(c.value for c in Category)
        sums = ", ".join(f"coalesce(sum({c}_tokens), 0)" for c in columns)
        query = f"SELECT {sums}, coalesce(sum(cost_pico), 0) FROM ledger_entries WHERE tenant_id = :t {where}"
        with self.server.db.connect() as conn:
            row = conn.execute(sa.text(query), {"t": self.tenant_id, **params}).one()
        n = len(columns)
        return {**{c: int(v) for c, v in zip(columns, row[:n], strict=True)}, "cost_pico": int(row[n])}


def run_async(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to the end from synchronous test code, in its own thread: sync Playwright keeps
    an event loop running on the test's thread, where asyncio.run is refused."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def seed_tenant(
    server: GatewayServer, name: str = "Acme Robotics", *, key_names: tuple[str, ...] = ("alpha", "beta")
) -> SeededTenant:
    tenant_id = server.new_tenant(name)
    key_ids = {key_name: server.new_key(tenant_id, name=key_name).key_id for key_name in key_names}

    async def write() -> tuple[SeededMonth, dict[str, str]]:
        async with open_database(server.database_url) as sessions:
            month = await seed_month(
                sessions,
                tenant_id=tenant_id,
                key_ids=list(key_ids.values()),
                models=[server.model, SECOND_MODEL],
                month=OCTOBER,
            )
            return month, await member_session(sessions, tenant_id=tenant_id)

    month, cookies = run_async(write)
    return SeededTenant(server=server, tenant_id=tenant_id, key_ids=key_ids, month=month, cookies=cookies)


def seed_this_month(seeded: SeededTenant, *, tenant_budget_usd: str, key_budget_usd: str) -> None:
    """This month so far, as for October, and budgets (the Overview's bars and alerts)."""
    server = seeded.server
    now = datetime.now(UTC)

    async def write() -> None:
        async with open_database(server.database_url) as sessions:
            await seed_month(
                sessions,
                tenant_id=seeded.tenant_id,
                key_ids=list(seeded.key_ids.values()),
                models=[server.model, SECOND_MODEL],
                month=month_start(now),
                until=now,
            )

    run_async(write)
    budget = {"monthly_limit_usd": tenant_budget_usd}
    server.admin.put(f"/admin/v1/tenants/{seeded.tenant_id}/budget", json=budget).raise_for_status()
    key_budget = {"monthly_limit_usd": key_budget_usd}
    server.admin.put(f"/admin/v1/keys/{seeded.key_ids['alpha']}/budget", json=key_budget).raise_for_status()


def finalize_month(seeded: SeededTenant) -> dict[str, Any]:
    """Finalize the tenant's October invoice through billing's admin API; its JSON with lines."""
    admin = seeded.server.admin
    listed = admin.get("/admin/v1/invoices", params={"tenant_id": seeded.tenant_id, "month": "2026-10"})
    listed.raise_for_status()
    (invoice,) = listed.json()["data"]
    if invoice["status"] == "draft":
        admin.post(f"/admin/v1/invoices/{invoice['id']}/finalize").raise_for_status()
    response = admin.get(f"/admin/v1/invoices/{invoice['id']}")
    response.raise_for_status()
    return response.json()
