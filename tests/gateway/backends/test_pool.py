"""EnginePool over real engine servers: routing, failover before the first token, mid-stream failure, all down."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from gateway.backends.engine_health import HealthPolicy
from gateway.backends.engine_list import EngineSpec
from gateway.backends.http import EngineMismatchError
from gateway.backends.pool import EnginePool
from gateway.backends.served_model import ServedModel
from gateway.routing.types import EngineLoad, RouteDecision
from inference.hashing import BlockHash
from inference.types import CacheSpec, EngineUnavailableError, RequestOutput, SamplingParams
from tests.gateway.backends.conftest import engine_process, serve_on
from tests.gateway.harness import free_port
from tests.inference.server.conftest import RunningServer
from tests.inference.server.helpers import expected_hit, token_prompt, unique_salt

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
# Probes far apart: a test decides when the pool finds out, by a request's failed connection.
QUIET = HealthPolicy(interval_s=3600, backoff_min_s=3600, backoff_max_s=3600)
BRISK = HealthPolicy(interval_s=0.05, backoff_min_s=0.05, backoff_max_s=0.2)


async def _run(pool: EnginePool, prompt: list[int], cache: CacheSpec, params: SamplingParams = GREEDY):
    handle = pool.submit(prompt, params, cache)
    async for _ in handle:
        pass
    return handle, await handle.result()


async def _wait_for(condition, what: str, timeout_s: float = 120.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)


def engine_id(server: RunningServer) -> str:
    """The id the engine gives in /kv/info (the pool's and the router's name for it)."""
    core = server.engine.core
    assert core is not None
    return core.engine_id


class FirstChoice:
    """A router that takes the first engine it is offered in `order`, and records what it learns."""

    uses_block_hashes = True

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.seen: list[Sequence[BlockHash]] = []
        self.actual: list[tuple[RouteDecision, int]] = []

    def choose(self, block_hashes, loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float) -> RouteDecision:
        self.seen.append(block_hashes)
        engine = next(e for e in self.order if e in loads and loads[e].healthy)
        return RouteDecision(engine=engine, predicted_hit_blocks=2, reason="test")

    def record_actual(self, decision: RouteDecision, actual_hit_blocks: int) -> None:
        self.actual.append((decision, actual_hit_blocks))


async def test_routes_with_the_pluggable_router_and_records_placement(
    engine_a: RunningServer, engine_b: RunningServer, served_model: ServedModel
) -> None:
    routers: list[FirstChoice] = []

    def factory(weights: Mapping[str, float]) -> FirstChoice:
        routers.append(FirstChoice([engine_id(engine_b), engine_id(engine_a)]))
        return routers[-1]

    pool = EnginePool([EngineSpec(engine_a.url), EngineSpec(engine_b.url)], model=served_model, router_factory=factory)
    await pool.start()
    try:
        assert pool.max_model_len == engine_a.engine.max_model_len
        prompt, salt = token_prompt(50, seed=201), unique_salt()
        await _run(pool, prompt, CacheSpec(salt))
        handle, output = await _run(pool, prompt, CacheSpec(salt))
        assert output.usage.cached_tokens == expected_hit(50)
        assert handle.attempts == [engine_b.url]
        assert handle.placement is not None
        assert (handle.placement.backend, handle.placement.engine_id) == ("kvgate", engine_id(engine_b))
        assert handle.placement.predicted_cached_tokens == 32
        router = routers[0]
        # The router saw the engines' own salted chained hashes, and learned the real count.
        assert router.seen[-1] == engine_b.engine.core.hasher.hash_blocks(prompt, salt)
        assert router.seen[-1] != engine_b.engine.core.hasher.hash_blocks(prompt, unique_salt())
        assert router.actual[-1][1] == expected_hit(50) // 16
        assert pool.weights == {engine_id(engine_a): 1.0, engine_id(engine_b): 1.0}
    finally:
        await pool.shutdown()


async def test_fails_over_before_the_first_token(
    tiny_llama_dir: Path, engine_b: RunningServer, served_model: ServedModel
) -> None:
    port = free_port()
    with serve_on(tiny_llama_dir, port) as dying:
        specs = [EngineSpec(dying, 100.0), EngineSpec(engine_b.url)]
        pool = EnginePool(specs, model=served_model, health=QUIET)
        await pool.start()
        await _wait_for(lambda: all(m.routable for m in pool.members), "both engines known")
    try:
        # The pool has not noticed the engine is gone; the weight sends the request there first.
        handle, output = await _run(pool, token_prompt(40, seed=202), CacheSpec(unique_salt()))
        assert output.finish_reason == "length", output.error
        assert handle.attempts == [dying, engine_b.url]
        assert handle.placement.engine_id == engine_id(engine_b)
        assert output.usage.prompt_tokens == 40 and output.usage.completion_tokens == GREEDY.max_tokens
        assert output.ttft_s is not None and 0 < output.ttft_s <= output.latency_s
        dead = next(m for m in pool.members if m.url == dying)
        assert not dead.routable and "failed before the first token" in dead.reason
        # Now it gets no traffic at all.
        handle, output = await _run(pool, token_prompt(40, seed=203), CacheSpec(unique_salt()))
        assert handle.attempts == [engine_b.url] and output.finish_reason == "length"
    finally:
        await pool.shutdown()


async def test_an_overloaded_engine_is_skipped_but_kept(
    tiny_llama_dir: Path, engine_b: RunningServer, served_model: ServedModel
) -> None:
    with serve_on(tiny_llama_dir, free_port(), max_waiting=0) as full:  # refuses every request: 503
        pool = EnginePool([EngineSpec(full, 100.0), EngineSpec(engine_b.url)], model=served_model, health=QUIET)
        await pool.start()
        try:
            await _wait_for(lambda: all(m.routable for m in pool.members), "both engines known")
            handle, output = await _run(pool, token_prompt(40, seed=208), CacheSpec(unique_salt()))
            assert output.finish_reason == "length"
            assert handle.attempts == [full, engine_b.url]
            # A 503 is the engine's answer, not a dead engine: it stays in the pool.
            assert all(m.routable for m in pool.members)
        finally:
            await pool.shutdown()


async def test_a_failure_mid_stream_ends_with_an_error_and_the_usage_sent(
    tiny_llama_dir: Path, engine_b: RunningServer, served_model: ServedModel
) -> None:
    with engine_process(tiny_llama_dir) as (url, process):
        pool = EnginePool([EngineSpec(url, 100.0), EngineSpec(engine_b.url)], model=served_model, health=QUIET)
        await pool.start()
        try:
            await _wait_for(lambda: all(m.routable for m in pool.members), "both engines known")
            handle = pool.submit(
                token_prompt(60, seed=204), SamplingParams(max_tokens=3000, ignore_eos=True), CacheSpec(unique_salt())
            )
            deltas = 0
            async for _ in handle:
                deltas += 1
                if deltas == 1:
                    process.send_signal(signal.SIGKILL)
            output: RequestOutput = await handle.result()
        finally:
            await pool.shutdown()
    assert handle.attempts == [url]  # after a token, never another engine
    assert output.finish_reason == "error" and output.error_kind == "unavailable"
    assert "mid-stream" in (output.error or "")
    usage = output.usage
    assert usage.prompt_tokens == 60 and usage.cache_write_tokens == expected_hit(60)
    assert deltas <= usage.completion_tokens < 3000
    assert output.text and len(output.text) >= deltas


async def test_all_engines_down_is_a_clear_unavailable_error(tiny_llama_dir: Path, served_model: ServedModel) -> None:
    port = free_port()
    with serve_on(tiny_llama_dir, port) as only:
        pool = EnginePool([EngineSpec(only)], model=served_model, health=QUIET)
        await pool.start()
        await pool.check_health()
    try:
        handle, output = await _run(pool, token_prompt(30, seed=205), CacheSpec())
        assert handle.attempts == [only]
        assert output.finish_reason == "error" and output.error_kind == "unavailable"
        assert "no engine could take the request" in (output.error or "")
        with pytest.raises(EngineUnavailableError, match="no engine is available"):
            await pool.check_health()
        with pytest.raises(EngineUnavailableError, match=only):
            pool.submit(token_prompt(30, seed=206), GREEDY, CacheSpec())
    finally:
        await pool.shutdown()


async def test_start_fails_clearly_when_no_engine_answers(served_model: ServedModel) -> None:
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    pool = EnginePool([EngineSpec(u) for u in urls], model=served_model, health=BRISK, start_wait_s=0.3)
    with pytest.raises(EngineUnavailableError, match="no engine answered") as caught:
        await pool.start()
    assert all(url in str(caught.value) for url in urls)
    await pool.shutdown()


async def test_start_refuses_an_engine_serving_another_model(
    engine_a: RunningServer, served_model: ServedModel
) -> None:
    wrong = ServedModel("not-the-engines-model", served_model.tokenizer)
    with pytest.raises(EngineMismatchError, match="not-the-engines-model"):
        await EnginePool([EngineSpec(engine_a.url)], model=wrong).start()
    right = EnginePool([EngineSpec(engine_a.url)], model=served_model)
    await right.start()
    await right.shutdown()


async def test_an_engine_that_comes_back_is_probed_back_in(tiny_llama_dir: Path, served_model: ServedModel) -> None:
    port = free_port()
    with serve_on(tiny_llama_dir, port) as url:
        pool = EnginePool([EngineSpec(url)], model=served_model, health=BRISK)
        await pool.start()
        member = pool.members[0]
        assert member.routable
    try:
        await _wait_for(lambda: not member.routable, "the probe notices")
        assert member.failures >= 1
        with serve_on(tiny_llama_dir, port):
            await _wait_for(lambda: member.routable, "the probe finds it back")
            _, output = await _run(pool, token_prompt(30, seed=207), CacheSpec())
            assert output.finish_reason == "length"
    finally:
        await pool.shutdown()


def test_probes_back_off_exponentially_up_to_a_cap() -> None:
    policy = HealthPolicy(interval_s=2, backoff_min_s=0.25, backoff_max_s=30)
    delays = [policy.delay_after_failures(n) for n in range(1, 10)]
    assert delays[:4] == [0.25, 0.5, 1.0, 2.0]
    assert delays[-1] == 30 and max(delays) == 30
    assert policy.delay_after_failures(10_000) == 30
