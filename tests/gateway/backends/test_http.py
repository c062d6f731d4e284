"""HttpEngine against a real engine server (`kvgate engine serve`'s app, tiny model, on a socket)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.backends.http import EngineMismatchError, HttpEngine
from gateway.backends.served_model import ServedModel
from inference.async_engine import AsyncEngine
from inference.types import CacheRegion, CacheSpec, EngineUnavailableError, RequestOutput, SamplingParams
from tests.gateway.harness import free_port
from tests.inference.server.conftest import RunningServer, tiny_settings
from tests.inference.server.helpers import expected_hit, token_prompt, unique_salt

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
async def remote(engine_a: RunningServer, served_model: ServedModel) -> AsyncIterator[HttpEngine]:
    engine = HttpEngine(engine_a.url, model=served_model)
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest.fixture(scope="module")
async def embedded(tiny_llama_dir: Path) -> AsyncIterator[AsyncEngine]:
    engine = AsyncEngine(tiny_settings(tiny_llama_dir, num_threads=1))
    await engine.start()
    yield engine
    await engine.shutdown()


async def _run(engine: HttpEngine | AsyncEngine, prompt: list[int], cache: CacheSpec) -> tuple[RequestOutput, list]:
    handle = engine.submit(prompt, GREEDY, cache)
    seen = []
    async for delta in handle:
        seen.append((delta.text, handle.prompt_usage))
    return await handle.result(), seen


async def test_describes_a_kvgate_engine(remote: HttpEngine, engine_a: RunningServer) -> None:
    assert remote.info is not None
    assert remote.info.flavour == "kvgate"
    assert remote.model_id == engine_a.engine.model_id
    assert remote.max_model_len == engine_a.engine.max_model_len
    await remote.check_health()


async def test_counts_and_output_equal_the_embedded_engines(remote: HttpEngine, embedded: AsyncEngine) -> None:
    base = token_prompt(70, seed=101)
    longer = [*base, *token_prompt(40, seed=102)]
    regions = (CacheRegion(end=48, ttl_s=3600), CacheRegion(end=100, ttl_s=300))
    steps = [(base, None), (base, None), (longer, None), (token_prompt(110, seed=103), regions)]
    remote_salt, embedded_salt = unique_salt(), unique_salt()
    for prompt, spec_regions in steps:
        over_http, _ = await _run(remote, prompt, CacheSpec(remote_salt, spec_regions))
        inside, _ = await _run(embedded, prompt, CacheSpec(embedded_salt, spec_regions))
        assert over_http.finish_reason == inside.finish_reason == "length"
        assert over_http.text == inside.text
        assert over_http.usage == inside.usage
    warm, _ = await _run(remote, base, CacheSpec(remote_salt))
    assert warm.usage.cached_tokens == expected_hit(70)


async def test_prompt_usage_is_known_before_the_first_delta(remote: HttpEngine) -> None:
    prompt, salt = token_prompt(50, seed=104), unique_salt()
    await _run(remote, prompt, CacheSpec(salt))
    output, seen = await _run(remote, prompt, CacheSpec(salt))
    assert seen and all(usage is not None for _, usage in seen)
    first_usage = seen[0][1]
    assert first_usage.cached_tokens == expected_hit(50) == output.usage.cached_tokens
    assert first_usage.completion_tokens == 0
    assert output.usage.completion_tokens == GREEDY.max_tokens
    assert output.ttft_s is not None and output.ttft_s <= output.latency_s


async def test_salts_isolate_tenants(remote: HttpEngine) -> None:
    prompt, salt = token_prompt(64, seed=105), unique_salt()
    await _run(remote, prompt, CacheSpec(salt))
    same, _ = await _run(remote, prompt, CacheSpec(salt))
    other, _ = await _run(remote, prompt, CacheSpec(unique_salt()))
    assert same.usage.cached_tokens == expected_hit(64)
    assert other.usage.cached_tokens == 0
    assert other.usage.cache_write_tokens == expected_hit(64)


async def test_cancel_ends_cancelled_with_the_usage_so_far(remote: HttpEngine) -> None:
    handle = remote.submit(token_prompt(40, seed=106), SamplingParams(max_tokens=3000, ignore_eos=True), CacheSpec())
    deltas = 0
    async for _ in handle:
        deltas += 1
        if deltas == 2:
            handle.cancel()
    output = await handle.result()
    assert output.finish_reason == "cancelled"
    assert 2 <= output.usage.completion_tokens < 3000
    assert output.usage.prompt_tokens == 40 and output.usage.cache_write_tokens == expected_hit(40)


async def test_an_invalid_request_is_a_client_error_not_a_failover(remote: HttpEngine) -> None:
    too_long = token_prompt(remote.max_model_len + 10, seed=107)
    output, _ = await _run(remote, too_long, CacheSpec())
    assert output.finish_reason == "error" and output.error_kind == "invalid_request"
    ok, _ = await _run(remote, token_prompt(20, seed=108), CacheSpec())
    assert ok.finish_reason == "length"


async def test_an_engine_serving_another_model_is_refused(engine_a: RunningServer, served_model: ServedModel) -> None:
    wrong = HttpEngine(engine_a.url, model=ServedModel("some-other-model", served_model.tokenizer))
    with pytest.raises(EngineMismatchError, match="some-other-model"):
        await wrong.start()
    right = HttpEngine(engine_a.url, model=served_model)
    await right.start()
    await right.shutdown()


async def test_an_engine_that_does_not_answer_is_unavailable(served_model: ServedModel) -> None:
    nobody = HttpEngine(f"http://127.0.0.1:{free_port()}", model=served_model)
    with pytest.raises(EngineUnavailableError):
        await nobody.start()
    with pytest.raises(EngineUnavailableError):
        await nobody.check_health()
    with pytest.raises(EngineUnavailableError):
        nobody.submit([1, 2, 3], GREEDY, CacheSpec())
    await nobody.shutdown()


async def test_a_request_cancelled_at_once_still_ends(remote: HttpEngine) -> None:
    handle = remote.submit(token_prompt(30, seed=109), GREEDY, CacheSpec())
    handle.cancel()  # before its task ever ran
    output = await asyncio.wait_for(handle.result(), timeout=60)
    assert output.finish_reason == "cancelled" and output.usage.completion_tokens == 0
    assert [delta async for delta in handle] == []
    done, _ = await _run(remote, token_prompt(30, seed=110), CacheSpec())
    assert done.finish_reason == "length"
