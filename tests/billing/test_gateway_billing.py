"""Billing inside the real gateway (tiny model, real engine, official SDKs over a socket).

- every response carries its exact cost, and the ledger's sums equal the engine-reported counts
- an exhausted budget is refused before the engine runs: 402 billing_error / 429 insufficient_quota
- the database taken away under live requests: usage is spooled, then replayed exactly once
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import openai
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from billing import budget_limits, budgets
from billing.models import LedgerEntry
from kvgate.db import create_engine, session_factory
from kvgate.tenancy import UsageRecord
from kvgate.usage import TokenCounts
from tests.billing.tcp_proxy import CuttableProxy
from tests.gateway.harness import GatewayServer

pytestmark = pytest.mark.timeout(300)

# prices.toml's '*' entry, which prices the tiny test model: USD per Mtok.
P_IN, P_OUT = Decimal("0.10"), Decimal("0.40")
SYSTEM = "You are a careful assistant who answers briefly. " * 30  # well over the 64-token minimum


def expected_cost(c: TokenCounts) -> Decimal:
    """The issue's formula, independently of billing's code."""
    equiv = c.input + Decimal("1.25") * c.cache_write_5m + 2 * c.cache_write_1h + Decimal("0.1") * c.cache_read
    return (P_IN * equiv + P_OUT * c.output) / 1_000_000


class Gate:
    """Holds admitted requests before their results while closed (it starts open)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self._lock = threading.Lock()
        self.held = 0

    async def pass_(self) -> None:
        if self.open.is_set():
            return
        with self._lock:
            self.held += 1
        try:
            while not self.open.is_set():
                await asyncio.sleep(0.01)
        finally:
            with self._lock:
                self.held -= 1


class GatedHandle:
    def __init__(self, inner: Any, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._inner.__aiter__()

    async def result(self) -> Any:
        await self._gate.pass_()
        return await self._inner.result()


class GatedEngine:
    """The engine with every result behind a gate, so requests can be held in flight."""

    def __init__(self, inner: Any, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit(
        self, prompt_token_ids: Sequence[int], params: Any, cache: Any, request_id: str | None = None, share: Any = None
    ) -> Any:
        inner = self._inner.submit(prompt_token_ids, params, cache, request_id=request_id, share=share)
        return GatedHandle(inner, self._gate)


@pytest.fixture(scope="module")
def server(db_url, tiny_llama_dir, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVGATE_SPOOL_PATH", str(tmp_path_factory.mktemp("spool") / "spool.jsonl"))
        # The database is shared with other billing tests, whose drafts must stay drafts.
        mp.setenv("KVGATE_AUTO_FINALIZE_INVOICES", "false")
        gw = GatewayServer(model_dir=tiny_llama_dir, database_url=db_url, discover_billing=True).start()
    try:
        yield gw
    finally:
        gw.stop()


def anthropic_counts(usage) -> TokenCounts:
    return TokenCounts(
        input=usage.input_tokens,
        cache_write_5m=usage.cache_creation.ephemeral_5m_input_tokens,
        cache_write_1h=usage.cache_creation.ephemeral_1h_input_tokens,
        cache_read=usage.cache_read_input_tokens,
        output=usage.output_tokens,
    )


def openai_counts(usage) -> TokenCounts:
    details = usage.prompt_tokens_details
    writes = getattr(details, "cache_write_tokens", 0) or 0
    return TokenCounts(
        input=usage.prompt_tokens - details.cached_tokens - writes,
        cache_write_5m=writes,
        cache_read=details.cached_tokens,
        output=usage.completion_tokens,
    )


async def ledger_sums(sessions, tenant: str) -> tuple[int, TokenCounts, int]:
    async with sessions() as session:
        row = (
            await session.execute(
                select(
                    func.count(),
                    *(func.sum(getattr(LedgerEntry, c)) for c in TokenCounts().as_columns()),
                    func.sum(LedgerEntry.cost_pico),
                ).where(LedgerEntry.tenant_id == tenant)
            )
        ).one()
    n, *tokens, cost = (int(v or 0) for v in row)
    return n, TokenCounts(*tokens), cost


async def wait_for_entries(sessions, tenant: str, n: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (await ledger_sums(sessions, tenant))[0] < n:
        assert time.monotonic() < deadline, "the ledger did not receive every request"
        await asyncio.sleep(0.1)


async def test_costs_in_responses_and_ledger_equals_engine_counts(server, sessions):
    key = server.new_key()
    tenant = key.tenant_id
    claude, gpt = server.anthropic(key), server.openai(key)
    seen: list[tuple[TokenCounts, Decimal]] = []
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    for turn in range(3):  # the same cached system prompt: a write, then reads
        raw = await asyncio.to_thread(
            claude.messages.with_raw_response.create,
            model=server.model,
            max_tokens=8,
            system=system,
            messages=[{"role": "user", "content": f"Question number {turn}?"}],
        )
        message = raw.parse()
        cost = Decimal(str(message.usage.cost_usd))
        assert Decimal(raw.headers["kvgate-cost-usd"]) == cost
        seen.append((anthropic_counts(message.usage), cost))
    assert seen[0][0].cache_write_5m > 0 and seen[1][0].cache_read == seen[0][0].cache_write_5m

    def stream_anthropic():
        with claude.messages.stream(
            model=server.model, max_tokens=8, system=system, messages=[{"role": "user", "content": "Stream please"}]
        ) as stream:
            # The SDK keeps extra usage fields on the event, not on its accumulated final message.
            deltas = [event for event in stream if event.type == "message_delta"]
            return stream.get_final_message(), Decimal(str(deltas[-1].usage.cost_usd))

    final, streamed_cost = await asyncio.to_thread(stream_anthropic)
    seen.append((anthropic_counts(final.usage), streamed_cost))

    long_prompt = "Tell me about caching. " * 40
    for _ in range(2):
        raw = await asyncio.to_thread(
            gpt.chat.completions.with_raw_response.create,
            model=server.model,
            max_tokens=8,
            messages=[{"role": "system", "content": long_prompt}, {"role": "user", "content": "hi"}],
        )
        completion = raw.parse()
        cost = Decimal(str(completion.usage.cost_usd))
        assert Decimal(raw.headers["kvgate-cost-usd"]) == cost
        seen.append((openai_counts(completion.usage), cost))

    def stream_openai():
        chunks = list(
            gpt.chat.completions.create(
                model=server.model,
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "system", "content": long_prompt}, {"role": "user", "content": "again"}],
            )
        )
        return chunks[-1].usage

    usage = await asyncio.to_thread(stream_openai)
    seen.append((openai_counts(usage), Decimal(str(usage.cost_usd))))

    await wait_for_entries(sessions, tenant, len(seen))
    n, ledger, ledger_cost = await ledger_sums(sessions, tenant)
    engine_total = sum((c for c, _ in seen), TokenCounts())
    assert n == len(seen) and ledger == engine_total  # token for token
    assert Decimal(ledger_cost).scaleb(-12) == sum(cost for _, cost in seen)
    for counts, cost in seen:  # each response's cost is the formula applied to its own counts
        assert cost == expected_cost(counts)
    assert engine_total.cache_read > 0 and engine_total.cache_write_5m > 0
    # The same numbers through the gateway's admin API (billing's routes behind the admin token).
    r = await asyncio.to_thread(
        server.admin.get, "/admin/v1/usage/summary", params={"tenant_id": tenant, "group_by": "model"}
    )
    assert r.status_code == 200 and Decimal(r.json()["data"][0]["cost_usd"]) == sum(cost for _, cost in seen)
    r = await asyncio.to_thread(httpx.get, f"{server.base_url}/admin/v1/usage/summary")
    assert r.status_code == 401


async def test_exhausted_budget_is_refused_before_the_engine_runs(server, sessions):
    key = server.new_key()
    tenant = key.tenant_id
    async with sessions() as session:
        await budget_limits.set_tenant_budget(
            session=session, tenant_id=tenant, monthly_limit_pico=10**6
        )  # one micro-dollar
        await session.commit()
    with pytest.raises(anthropic.APIStatusError) as refused:
        await asyncio.to_thread(
            server.anthropic(key).messages.create,
            model=server.model,
            max_tokens=64,
            messages=[{"role": "user", "content": "hello"}],
        )
    assert refused.value.status_code == 402 and refused.value.body["error"]["type"] == "billing_error"
    with pytest.raises(openai.RateLimitError) as quota:
        await asyncio.to_thread(
            server.openai(key).chat.completions.create,
            model=server.model,
            max_tokens=64,
            messages=[{"role": "user", "content": "hello"}],
        )
    assert quota.value.status_code == 429 and quota.value.code == "insufficient_quota"
    assert (await ledger_sums(sessions, tenant))[0] == 0
    # Each refusal is a usage record (status "refused") with the budget and the reserve that did not fit.
    for error, endpoint in ((refused.value, "messages"), (quota.value, "chat.completions")):
        record = server.usage_record(error.request_id or "")
        assert record is not None and record["status"] == "refused", endpoint
        assert (record["endpoint"], record["model"], record["refusal_reason"]) == (
            endpoint,
            server.model,
            "tenant_month",
        )
        assert record["refusal_reserve_pico"] > 10**6 and record["input_tokens"] == 0
    # Positive control: with room in the budget the same request runs and is charged.
    async with sessions() as session:
        await budget_limits.set_tenant_budget(session=session, tenant_id=tenant, monthly_limit_pico=10**12)
        await session.commit()
    message = await asyncio.to_thread(
        server.anthropic(key).messages.create,
        model=server.model,
        max_tokens=4,
        messages=[{"role": "user", "content": "hello"}],
    )
    assert Decimal(str(message.usage.cost_usd)) > 0
    await wait_for_entries(sessions, tenant, 1)
    async with sessions() as session:
        status = await budgets.budget_status(session=session, tenant_id=tenant)
    assert status.month.reserved_pico == 0 and status.month.spent_pico == (await ledger_sums(sessions, tenant))[2]


@pytest.mark.postgres
async def test_database_taken_away_under_live_requests(postgres_url, tiny_llama_dir, tmp_path, monkeypatch):
    """On PostgreSQL through a proxy the test cuts (SQLite's outage is simulated in test_spool.py)."""
    db_url = postgres_url
    url = make_url(db_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432)
    await proxy.start()
    monkeypatch.setenv("KVGATE_SPOOL_PATH", str(tmp_path / "spool.jsonl"))
    monkeypatch.setenv("KVGATE_SPOOL_REPLAY_INTERVAL_S", "0.2")
    monkeypatch.setenv("KVGATE_AUTO_FINALIZE_INVOICES", "false")
    proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
    gate = Gate()
    gw = GatewayServer(
        model_dir=tiny_llama_dir,
        database_url=proxied,
        discover_billing=True,
        wrap_engine=lambda engine: GatedEngine(engine, gate),
    )
    await asyncio.to_thread(gw.start)
    direct = create_engine(db_url)
    sessions = session_factory(direct)
    try:
        # The proxy runs on this event loop: blocking calls go to threads, or nothing is forwarded.
        key = await asyncio.to_thread(gw.new_key)
        tenant = key.tenant_id
        claude = gw.anthropic(key)
        n = 6
        gate.open.clear()  # requests will be admitted, then held before their results
        results: list = [None] * n

        def call(i: int) -> None:
            raw = claude.messages.with_raw_response.create(
                model=gw.model, max_tokens=6, messages=[{"role": "user", "content": f"request {i} " * (i + 1)}]
            )
            results[i] = (raw.headers, raw.parse())

        threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while gate.held < n:
            assert time.monotonic() < deadline, "requests were not admitted"
            await asyncio.sleep(0.02)
        proxy.cut()  # the database goes away with every request in flight
        gate.open.set()
        for t in threads:
            await asyncio.to_thread(t.join, 60)
        assert all(r is not None for r in results), "every request still answered"
        assert gw.billing.service.spool.pending() == n
        assert (await ledger_sums(sessions, tenant))[0] == 0
        proxy.restore()
        await wait_for_entries(sessions, tenant, n, timeout_s=60)
        await asyncio.sleep(0.5)  # a second replay round must not add anything
        count, ledger, cost = await ledger_sums(sessions, tenant)
        engine_total = sum((anthropic_counts(m.usage) for _, m in results), TokenCounts())
        told = sum(Decimal(h["kvgate-cost-usd"]) for h, _ in results)
        assert count == n and ledger == engine_total and Decimal(cost).scaleb(-12) == told
        assert gw.billing.service.spool.pending() == 0
        async with sessions() as session:
            records = await session.scalar(select(func.count()).where(UsageRecord.tenant_id == tenant))
            sources = (
                (
                    await session.execute(
                        text("SELECT DISTINCT source FROM ledger_entries WHERE tenant_id = :t"), {"t": tenant}
                    )
                )
                .scalars()
                .all()
            )
        assert records == n and sources == ["spool"]
    finally:
        gate.open.set()
        await asyncio.to_thread(gw.stop)
        await direct.dispose()
        await proxy.stop()
