"""A database outage under a real gateway (tiny model, billing as `kvgate serve` runs it), on PostgreSQL
through a proxy the test cuts (connections refused) and stalls (a blackhole that never answers):

- keys that just worked keep working from the last-known-good cache; a valid key the gateway has not
  seen gets 529 overloaded_error (Anthropic) / 503 (OpenAI) with retry-after, never a 500 or a 401;
  keys revoked before the outage (through the admin API or behind the gateway's back) do not come back;
  the admin API gets a 503 in its error shape;
- during a stall every request answers within the database timeouts instead of hanging;
- the log has one line when the database goes and one when it is back, and no tracebacks;
- usage spooled meanwhile is replayed exactly once after the restore;
- a tenant with a small monthly limit is refused once its in-memory spend reaches the limit, while
  a tenant without limits keeps working.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import openai
import pytest
import structlog
from sqlalchemy import func, select, update
from sqlalchemy.engine import make_url

from billing import budgets
from billing.models import LedgerEntry
from kvgate.db import create_engine, session_factory, utcnow
from kvgate.tenancy import ApiKey, UsageRecord
from tests.billing.tcp_proxy import CuttableProxy
from tests.gateway.harness import GatewayServer, Key

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(300)]

STALE_TTL_S = 300
# How long any one request may take while the database stalls: a connect or a statement
# timeout (3 s each here) and the session's clean-up, with room for a loaded machine.
STALL_ANSWER_S = 60


class Outage:
    """The gateway behind the proxy, a direct session factory for checks, and captured logs."""

    def __init__(self, gw: GatewayServer, proxy: CuttableProxy, sessions: Any, logs: list[dict[str, Any]]) -> None:
        self.gw = gw
        self.proxy = proxy
        self.sessions = sessions
        self.logs = logs

    async def call(self, fn: Callable[[], Any]) -> Any:
        # The proxy runs on this event loop: blocking clients go to threads.
        return await asyncio.wait_for(asyncio.to_thread(fn), STALL_ANSWER_S)

    async def message(self, key: Key, text: str = "hello there") -> Any:
        return await self.call(
            lambda: self.gw.anthropic(key).messages.create(
                model=self.gw.model, max_tokens=4, messages=[{"role": "user", "content": text}]
            )
        )

    async def chat(self, key: Key) -> Any:
        return await self.call(
            lambda: self.gw.openai(key).chat.completions.create(
                model=self.gw.model, max_tokens=4, messages=[{"role": "user", "content": "hello there"}]
            )
        )

    async def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self.call(lambda: self.gw.admin.request(method, path, **kwargs))

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs if e.get("event") == name]


@pytest.fixture(scope="module")
async def outage(postgres_url, tiny_llama_dir, tmp_path_factory) -> AsyncIterator[Outage]:
    url = make_url(postgres_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432)
    await proxy.start()
    proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVGATE_SPOOL_PATH", str(tmp_path_factory.mktemp("outage-spool") / "spool.jsonl"))
        mp.setenv("KVGATE_SPOOL_REPLAY_INTERVAL_S", "0.2")
        mp.setenv("KVGATE_AUTO_FINALIZE_INVOICES", "false")
        mp.setenv("KVGATE_DB_CONNECT_TIMEOUT_S", "3")
        mp.setenv("KVGATE_DB_STATEMENT_TIMEOUT_S", "3")
        mp.setenv("KVGATE_DB_POOL_TIMEOUT_S", "3")
        gw = GatewayServer(
            model_dir=tiny_llama_dir,
            database_url=proxied,
            discover_billing=True,
            auth_cache_ttl_s=0.2,
            auth_stale_ttl_s=STALE_TTL_S,
        )
        await asyncio.to_thread(gw.start)
        direct = create_engine(postgres_url)
        with structlog.testing.capture_logs() as logs:
            try:
                yield Outage(gw, proxy, session_factory(direct), logs)
            finally:
                proxy.restore()
                await asyncio.to_thread(gw.stop)
                await direct.dispose()
                await proxy.stop()


def assert_retryable(exc: BaseException, status: int) -> None:
    assert isinstance(exc, anthropic.APIStatusError | openai.APIStatusError), repr(exc)
    assert exc.status_code == status, (exc.status_code, exc.response.text)
    assert int(exc.response.headers["retry-after"]) >= 1


async def refused(coro: Any) -> BaseException:
    try:
        await coro
    except (anthropic.APIStatusError, openai.APIStatusError) as exc:
        return exc
    raise AssertionError("the request was not refused")


async def check_admin_unavailable(o: Outage) -> None:
    for path in ("/admin/v1/tenants", "/admin/v1/usage"):  # the gateway's and billing's admin routes
        r = await o.admin("GET", path)
        assert r.status_code == 503, r.text
        assert r.json()["type"] == "error" and "database" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1


async def ledger_count(o: Outage, tenant: str) -> int:
    async with o.sessions() as session:
        return await session.scalar(select(func.count()).where(LedgerEntry.tenant_id == tenant))


async def wait_recovered(o: Outage) -> None:
    """The spool replayed and the database answering the gateway again."""
    deadline = time.monotonic() + 60
    while o.gw.billing.service.spool.pending() or not o.gw.gateway.db_health.available:
        assert time.monotonic() < deadline, "the gateway did not recover"
        await asyncio.sleep(0.1)


async def test_outage_keeps_known_keys_working_and_refuses_unknown_ones_retryably(outage: Outage, caplog):
    o = outage
    caplog.set_level(logging.WARNING)
    known = await o.call(o.gw.new_key)
    # Valid keys this gateway has never authenticated, one per outage.
    never_seen = {phase: await o.call(o.gw.new_key) for phase in ("cut", "stall")}
    # Keys revoked before the outage must not come back from the last-known-good cache: one
    # through the admin API (evicted at once), one behind the gateway's back (as the CLI or
    # another gateway would), which the database refuses at the next check.
    revoked = [await o.call(o.gw.new_key) for _ in range(2)]
    for key in revoked:
        await o.message(key)
    assert (await o.admin("POST", f"/admin/v1/keys/{revoked[0].key_id}/revoke")).status_code == 200
    async with o.sessions() as session:
        await session.execute(update(ApiKey).where(ApiKey.id == revoked[1].key_id).values(revoked_at=utcnow()))
        await session.commit()
    await asyncio.sleep(0.3)  # past the fresh auth cache
    for key in revoked:
        assert (await refused(o.message(key))).status_code == 401
    await o.message(known)
    await o.chat(known)
    answered = 2

    for phase, unseen in never_seen.items():
        getattr(o.proxy, phase)()
        await asyncio.sleep(0.3)  # past the fresh auth cache's 0.2 s
        # A known key: answered from the last-known-good cache, usage to the spool.
        message = await o.message(known)
        assert message.usage.output_tokens > 0
        assert (await o.chat(known)).usage.completion_tokens > 0
        answered += 2
        # A key the gateway cannot vouch for: retryable, in each API's shape.
        exc = await refused(o.message(unseen))
        assert_retryable(exc, 529)
        assert exc.body["error"]["type"] == "overloaded_error"
        assert_retryable(await refused(o.chat(unseen)), 503)
        for key in revoked:  # not in the last-known-good cache: the gateway cannot vouch for them
            assert_retryable(await refused(o.message(key)), 529)
        # A malformed key cannot be valid whatever the database says: still a 401.
        assert (await refused(o.message(Key(known.tenant_id, known.key_id, "kvg-nope")))).status_code == 401
        await check_admin_unavailable(o)
        assert o.proxy.stalled == (phase == "stall"), "every request answered during the stall"
        assert o.gw.billing.service.spool.pending() >= 2
        assert await ledger_count(o, known.tenant_id) < answered

        o.proxy.restore()
        await wait_recovered(o)
        # Everything works again, the key the outage refused included.
        await o.message(unseen)
        r = await o.admin("GET", "/admin/v1/tenants")
        assert r.status_code == 200, r.text

    # Spooled usage replayed exactly once: one ledger entry and one usage record per answer.
    async with o.sessions() as session:
        records = await session.scalar(select(func.count()).where(UsageRecord.tenant_id == known.tenant_id))
    assert await ledger_count(o, known.tenant_id) == answered and records == answered
    await asyncio.sleep(0.5)  # another replay round adds nothing
    assert await ledger_count(o, known.tenant_id) == answered

    # One line when the database went, one when it came back, per outage; no traceback anywhere.
    assert len(o.events("database_unavailable")) == 2 and len(o.events("database_available")) == 2
    assert not [e for e in o.logs if "traceback" in e or e.get("event") == "unhandled_error"]
    noisy = [e for e in o.logs if e.get("log_level") in ("warning", "error", "critical")]
    assert len(noisy) == 4, noisy
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


async def test_outage_spend_is_bounded_by_each_budget(outage: Outage):
    o = outage
    limited = await o.call(o.gw.new_key)
    unlimited = await o.call(o.gw.new_key)
    first = await o.message(limited)  # admitted online: billing now knows this tenant's budget
    await o.message(unlimited)
    prompt_tokens = first.usage.input_tokens + first.usage.cache_read_input_tokens
    estimate = o.gw.billing.service.estimate_pico(
        model=o.gw.model, prompt_tokens=prompt_tokens, max_output_tokens=4, at=utcnow()
    )
    limit_pico = 5 * estimate
    r = await o.admin(
        "PUT", f"/admin/v1/tenants/{limited.tenant_id}/budget", json={"monthly_limit_usd": usd(limit_pico)}
    )
    assert r.status_code == 200, r.text
    await o.message(limited)  # online again, under the new limit: the snapshot now carries it

    o.proxy.cut()
    await asyncio.sleep(0.3)
    admitted = 0
    for _ in range(20):
        try:
            await o.message(limited)
        except anthropic.APIStatusError as exc:
            assert exc.status_code == 402 and exc.body["error"]["type"] == "billing_error", exc.response.text
            break
        admitted += 1
        # The tenant without limits is never held back.
        await o.message(unlimited)
    else:
        raise AssertionError("the limited tenant was never refused during the outage")
    assert admitted >= 1, "the outage admitted nothing at all"
    for _ in range(3):  # still working after the other one was refused
        await o.message(unlimited)

    o.proxy.restore()
    await wait_recovered(o)
    async with o.sessions() as session:
        status = await budgets.budget_status(session=session, tenant_id=limited.tenant_id)
    assert await ledger_count(o, limited.tenant_id) == 2 + admitted
    assert status.month.reserved_pico == 0
    assert status.month.spent_pico <= limit_pico  # the outage did not let it past its limit


def usd(pico: int) -> str:
    return format(Decimal(pico).scaleb(-12).normalize(), "f")
