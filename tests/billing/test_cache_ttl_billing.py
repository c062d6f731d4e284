"""OpenAI's 30m and 12h cache TTLs through the real gateway and billing: each is its own category
in the usage record and the ledger, priced at the catalog's rate; and a budget refusal is sent once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from decimal import Decimal
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from sqlalchemy import select

from billing import budget_limits
from billing.models import LedgerEntry
from billing.prices import load_price_file
from kvgate.usage import TokenCounts
from tests.gateway.harness import GatewayServer

pytestmark = pytest.mark.timeout(300)

# prices.toml's '*' entry, which prices the tiny test model: USD per Mtok.
P_IN, P_OUT = Decimal("0.10"), Decimal("0.40")
SYSTEM = "You are a careful assistant who answers briefly and never guesses. " * 20


def expected_cost(c: TokenCounts) -> Decimal:
    """The catalog's multipliers written out independently: 30m 1.7x, 12h 5x, read 0.1x."""
    equiv = (
        c.input
        + Decimal("1.25") * c.cache_write_5m
        + Decimal("1.7") * c.cache_write_30m
        + 2 * c.cache_write_1h
        + 5 * c.cache_write_12h
        + Decimal("0.1") * c.cache_read
    )
    return (P_IN * equiv + P_OUT * c.output) / 1_000_000


@pytest.fixture(scope="module")
def server(db_url, tiny_llama_dir, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVGATE_SPOOL_PATH", str(tmp_path_factory.mktemp("spool") / "spool.jsonl"))
        mp.setenv("KVGATE_AUTO_FINALIZE_INVOICES", "false")
        gw = GatewayServer(model_dir=tiny_llama_dir, database_url=db_url, discover_billing=True).start()
    try:
        yield gw
    finally:
        gw.stop()


async def ledger_entry(sessions, request_id: str, timeout_s: float = 30) -> LedgerEntry:
    deadline = time.monotonic() + timeout_s
    while True:
        async with sessions() as session:
            entry = await session.scalar(select(LedgerEntry).where(LedgerEntry.request_id == request_id))
        if entry is not None:
            return entry
        assert time.monotonic() < deadline, "the request never reached the ledger"
        await asyncio.sleep(0.1)


def test_the_catalog_prices_the_new_classes():
    star = next(spec for spec in load_price_file() if spec.model == "*")
    assert star.ttl_classes[:4] == ("5m", "30m", "1h", "12h")
    assert star.rates.cache_write_30m == star.rates.input * 17 // 10
    assert star.rates.cache_write_12h == star.rates.input * 5


async def test_12h_and_30m_writes_are_billed_in_their_own_categories(server, sessions):
    client = server.openai(server.new_key())
    system = [
        {"type": "text", "text": SYSTEM, "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}},
    ]
    seen: list[tuple[str, Any]] = []
    for question in ("What is a cache?", "And a TTL?"):  # writes, then reads the 12h prefix
        raw = await asyncio.to_thread(
            client.chat.completions.with_raw_response.create,
            model=server.model,
            max_tokens=4,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question + uuid.uuid4().hex}],
            prompt_cache_options={"mode": "implicit", "ttl": "30m"},
        )
        seen.append((raw.headers["x-request-id"], raw.parse()))
    for request_id, completion in seen:
        entry = await ledger_entry(sessions, request_id)
        counts = TokenCounts.from_columns(entry)
        record = server.usage_record(request_id)
        assert record is not None and TokenCounts.from_columns(record) == counts
        details = completion.usage.prompt_tokens_details
        assert counts.prompt_tokens == completion.usage.prompt_tokens
        assert counts.cache_read == details.cached_tokens and counts.cache_writes == details.cache_write_tokens
        # The response's cost, the ledger's and the catalog's formula agree to the pico-dollar.
        cost = Decimal(str(completion.usage.cost_usd))
        assert cost == expected_cost(counts) == Decimal(entry.cost_pico).scaleb(-12)
    first = TokenCounts.from_columns(await ledger_entry(sessions, seen[0][0]))
    second = TokenCounts.from_columns(await ledger_entry(sessions, seen[1][0]))
    # First: the system prompt in 12h, the rest (the implicit breakpoint) in 30m; nothing in 5m or 1h.
    assert first.cache_write_12h >= 240 and first.cache_write_30m > 0
    assert first.cache_write_5m == first.cache_write_1h == first.cache_write_24h == 0
    # Second: reads the 12h prefix, writes its own tail in 30m.
    assert second.cache_read == first.cache_write_12h and second.cache_write_12h == 0
    assert second.cache_write_30m > 0


async def test_a_budget_refusal_is_sent_once(server, sessions):
    key = server.new_key()
    async with sessions() as session:
        await budget_limits.set_tenant_budget(session=session, tenant_id=key.tenant_id, monthly_limit_pico=10**6)
        await session.commit()
    attempts: list[str] = []
    strip = False

    def count(request: httpx2.Request) -> None:
        attempts.append(request.url.path)

    def maybe_strip(response: httpx2.Response) -> None:
        if strip:
            del response.headers["x-should-retry"]

    def http_client() -> httpx2.Client:
        return httpx2.Client(event_hooks={"request": [count], "response": [maybe_strip]})

    # The SDKs' default retries: OpenAI's retries a 429 twice unless told not to.
    gpt = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key.key, max_retries=2, http_client=http_client())
    claude = anthropic.Anthropic(base_url=server.base_url, api_key=key.key, max_retries=2, http_client=http_client())
    body = {"model": server.model, "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
    with pytest.raises(openai.RateLimitError) as quota:
        await asyncio.to_thread(gpt.chat.completions.create, **body)
    assert quota.value.code == "insufficient_quota"
    assert quota.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(anthropic.APIStatusError) as refused:
        await asyncio.to_thread(claude.messages.create, **body)
    assert refused.value.status_code == 402 and refused.value.response.headers["x-should-retry"] == "false"
    assert attempts == ["/v1/chat/completions", "/v1/messages"]
    # Positive control: the same refusal without the header is retried twice by the same client.
    attempts.clear()
    strip = True
    with pytest.raises(openai.RateLimitError):
        await asyncio.to_thread(gpt.chat.completions.create, **body)
    assert attempts == ["/v1/chat/completions"] * 3


async def test_reads_past_the_last_breakpoint_are_reported_and_billed(server, sessions):
    """kvgate reads what a tenant cached before even where a request has no effective breakpoint
    (providers report nothing there): the read is reported, the counts still add up to the
    prompt, and the ledger charges exactly the reported counts (reads at 0.1x)."""
    key = server.new_key()
    claude, gpt = server.anthropic(key), server.openai(key)
    question = [{"role": "user", "content": "Do you sell tickets?"}]

    def blocks(short_ttl: bool) -> list[dict[str, Any]]:
        short = {"type": "text", "text": "Be brief."}
        long = {"type": "text", "text": SYSTEM}
        marker = {"cache_control": {"type": "ephemeral"}}
        return [{**short, **marker}, long] if short_ttl else [short, {**long, **marker}]

    body = {"model": server.model, "max_tokens": 4, "messages": question}
    writer = await asyncio.to_thread(claude.messages.create, system=blocks(short_ttl=False), **body)
    assert writer.usage.cache_creation_input_tokens >= 240
    # Only a breakpoint below the minimum: no region, nothing written, but the prefix is read.
    raw = await asyncio.to_thread(claude.messages.with_raw_response.create, system=blocks(short_ttl=True), **body)
    reader = raw.parse()
    usage = reader.usage
    assert usage.cache_read_input_tokens == writer.usage.cache_creation_input_tokens
    assert usage.cache_creation_input_tokens == 0
    counted = await asyncio.to_thread(
        claude.messages.count_tokens, model=server.model, system=blocks(short_ttl=True), messages=question
    )
    assert usage.input_tokens + usage.cache_read_input_tokens == counted.input_tokens
    # OpenAI: explicit mode without breakpoints writes nothing and reads the same prefix.
    chat = await asyncio.to_thread(
        gpt.chat.completions.with_raw_response.create,
        model=server.model,
        max_tokens=4,
        messages=[{"role": "system", "content": "Be brief.\n\n" + SYSTEM}, *question],
        prompt_cache_options={"mode": "explicit"},
    )
    completion = chat.parse()
    details = completion.usage.prompt_tokens_details
    assert details.cache_write_tokens == 0 and details.cached_tokens == usage.cache_read_input_tokens
    for request_id, cost in (
        (raw.headers["request-id"], Decimal(str(usage.cost_usd))),
        (chat.headers["x-request-id"], Decimal(str(completion.usage.cost_usd))),
    ):
        entry = await ledger_entry(sessions, request_id)
        counts = TokenCounts.from_columns(entry)
        assert counts.cache_read == usage.cache_read_input_tokens and counts.cache_writes == 0
        assert counts.input + counts.cache_read == counts.prompt_tokens
        assert cost == expected_cost(counts) == Decimal(entry.cost_pico).scaleb(-12)
