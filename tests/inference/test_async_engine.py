"""The asyncio interface the gateway uses: concurrency, streaming, cancellation, overload."""

from __future__ import annotations

import asyncio
import random

import pytest

from inference.async_engine import AsyncEngine
from inference.clock import ManualClock
from inference.settings import EngineSettings
from inference.types import CacheSpec, EngineOverloadedError, InvalidRequestError, SamplingParams
from tests.inference.helpers import checked, random_prompt

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture
async def engine(tiny_llama_dir):
    eng = AsyncEngine(
        EngineSettings(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.02, max_waiting=40),
        clock=ManualClock(),
    )
    await eng.start()
    yield eng
    await eng.shutdown()


async def test_16_concurrent_requests_finish_with_the_outputs_they_get_alone(engine):
    rng = random.Random(41)
    prompts = [random_prompt(rng, rng.randrange(10, 200)) for _ in range(16)]
    alone = [(await engine.generate(p, GREEDY, CacheSpec(salt="alone"))).token_ids for p in prompts]
    together = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    assert [checked(o).token_ids for o in together] == alone
    assert len(set(alone)) == 16


async def test_streamed_deltas_add_up_to_the_result(engine):
    handle = engine.submit(random_prompt(random.Random(42), 30), GREEDY, CacheSpec())
    tokens, text = [], ""
    async for delta in handle:
        tokens.extend(delta.token_ids)
        text += delta.text
    out = await handle.result()
    assert tuple(tokens) == out.token_ids and text == out.text and len(tokens) == 24


async def test_cancel_frees_blocks_keeps_commits_and_reports_usage(engine):
    prompt = random_prompt(random.Random(43), 100)
    handle = engine.submit(prompt, SamplingParams(max_tokens=500, temperature=0, ignore_eos=True), CacheSpec())
    seen = 0
    async for _ in handle:
        seen += 1
        if seen == 3:
            handle.cancel()
    out = await handle.result()
    assert out.finish_reason == "cancelled"
    assert 3 <= out.usage.completion_tokens < 500
    assert out.usage.cache_write_tokens == 96
    core = engine.core
    await asyncio.sleep(0)
    assert core.pool.num_used == 0
    again = await engine.generate(prompt, GREEDY)
    assert again.usage.cached_tokens == 96  # what it committed survived the cancel


async def test_bad_requests_fail_at_submit_and_a_full_queue_fails_fast(engine):
    with pytest.raises(InvalidRequestError):
        engine.submit([], GREEDY, CacheSpec())
    long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    handles = []
    with pytest.raises(EngineOverloadedError):
        for _ in range(200):
            handles.append(engine.submit(random_prompt(random.Random(44), 300), long, CacheSpec()))
    assert 40 <= len(handles) < 200
    for h in handles:
        h.cancel()
    results = await asyncio.gather(*(h.result() for h in handles))
    assert {r.finish_reason for r in results} <= {"cancelled", "length"}
    assert (await engine.generate([5, 6, 7], GREEDY)).usage.completion_tokens == 24


async def test_prompt_usage_is_known_with_the_first_token(engine):
    prompt = random_prompt(random.Random(45), 70)
    await engine.generate(prompt, GREEDY)
    handle = engine.submit(prompt, GREEDY, CacheSpec())
    assert handle.prompt_usage is None
    async for _ in handle:
        assert handle.prompt_usage is not None
        break
    out = await handle.result()
    early = handle.prompt_usage
    assert (early.cached_tokens, early.cache_write_tokens) == (out.usage.cached_tokens, out.usage.cache_write_tokens)
    assert early.cached_tokens == 64
