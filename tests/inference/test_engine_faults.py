"""A fault in one request's work fails that request alone; a dead engine thread fails everything at once.

Faults are injected into one engine instance (its runner, its detokenizers, its step),
never into production code.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest
import torch

from inference.async_engine import AsyncEngine
from inference.clock import ManualClock
from inference.engine import Engine
from inference.settings import EngineSettings
from inference.types import (
    CacheSpec,
    EngineUnavailableError,
    InvalidRequestError,
    RequestOutput,
    SamplingParams,
)
from tests.inference.helpers import GREEDY, checked, random_prompt

POISON = 7  # a token id random_prompt never draws (it draws from [100, 40000))
LONG = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)


def run_all(engine: Engine) -> dict[str, RequestOutput]:
    finished = {}
    while engine.has_unfinished():
        finished.update({o.request_id: o.finished for o in engine.step() if o.finished is not None})
    return finished


def assert_pool_idle(engine: Engine) -> None:
    """Every block is back in the free queues, none still referenced."""
    assert engine.pool.num_used == 0
    assert all(b.ref_count == 0 for b in engine.pool.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting


def poison_forward_pass(engine: Engine) -> None:
    """The runner raises for any pass that contains the POISON token, as a bad input to a kernel would."""
    execute = engine.runner.execute

    def faulty(chunks: Any) -> torch.Tensor:
        if any(POISON in c.token_ids for c in chunks):
            raise RuntimeError("injected kernel fault")
        return execute(chunks)

    engine.runner.execute = faulty  # type: ignore[method-assign]


def test_a_forward_pass_fault_fails_only_the_request_that_fails_alone(make_engine, tiny_llama_dir) -> None:
    rng = random.Random(5)
    good = [random_prompt(rng, n) for n in (40, 70, 25)]
    poisoned = random_prompt(rng, 50)
    poisoned[30] = POISON
    alone = [make_engine(tiny_llama_dir).generate(p, GREEDY).token_ids for p in good]

    engine = make_engine(tiny_llama_dir)
    poison_forward_pass(engine)
    for i, prompt in enumerate(good):
        engine.add_request(f"good-{i}", prompt, GREEDY, CacheSpec())
    engine.add_request("poisoned", poisoned, GREEDY, CacheSpec())
    finished = run_all(engine)

    bad = finished.pop("poisoned")
    assert bad.finish_reason == "error" and bad.error_kind == "internal"
    assert "injected kernel fault" in (bad.error or "")
    assert bad.usage.completion_tokens == 0 and checked(bad).usage.cache_write_tokens == 0
    # The others ran in the same steps, were recomputed one by one, and still got their own outputs.
    assert [checked(finished[f"good-{i}"]).token_ids for i in range(3)] == alone
    assert_pool_idle(engine)
    # Their commits are intact: the same prompts now read their cached blocks.
    again = engine.generate(good[1], GREEDY)
    assert again.usage.cached_tokens == 64 and again.token_ids == alone[1]


def test_a_detokenizer_or_sampling_fault_fails_one_request_and_frees_its_blocks(make_engine, tiny_llama_dir) -> None:
    engine = make_engine(tiny_llama_dir)
    rng = random.Random(6)
    engine.add_request("ok", random_prompt(rng, 40), GREEDY, CacheSpec())
    engine.add_request("bad-text", random_prompt(rng, 40), GREEDY, CacheSpec())
    seeded = SamplingParams(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True)
    engine.add_request("bad-sample", random_prompt(rng, 40), seeded, CacheSpec())
    engine.step()  # both past their first token

    def broken(_: int) -> None:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")

    engine._tracked["bad-text"].detokenizer.add = broken  # type: ignore[method-assign]
    engine._tracked["bad-sample"].generator = "not a generator"  # type: ignore[assignment]
    finished = run_all(engine)

    assert finished["bad-text"].finish_reason == "error" and "UnicodeDecodeError" in (finished["bad-text"].error or "")
    assert finished["bad-sample"].finish_reason == "error" and finished["bad-sample"].error_kind == "internal"
    assert checked(finished["bad-text"]).usage.completion_tokens >= 1
    assert checked(finished["ok"]).finish_reason == "length" and len(finished["ok"].token_ids) == 8
    assert_pool_idle(engine)


def test_an_admission_fault_fails_that_request_and_the_queue_moves_on(make_engine, tiny_llama_dir) -> None:
    engine = make_engine(tiny_llama_dir)
    find_hits = engine.kv.find_hits

    def faulty(request: Any) -> Any:
        if request.request_id == "bad":
            raise OSError("injected: the disk tier is gone")
        return find_hits(request)

    engine.kv.find_hits = faulty  # type: ignore[method-assign]
    rng = random.Random(7)
    engine.add_request("bad", random_prompt(rng, 40), GREEDY, CacheSpec())
    engine.add_request("after", random_prompt(rng, 40), GREEDY, CacheSpec())
    finished = run_all(engine)
    assert finished["bad"].finish_reason == "error" and "disk tier is gone" in (finished["bad"].error or "")
    assert checked(finished["after"]).finish_reason == "length"
    assert_pool_idle(engine)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
def test_a_seed_torch_cannot_take_is_refused_before_it_reaches_the_sampler(tiny_engine: Engine, seed: int) -> None:
    params = SamplingParams(max_tokens=2, temperature=1.0, seed=seed)
    with pytest.raises(InvalidRequestError, match="seed"):
        tiny_engine.validate([100, 200, 300], params, CacheSpec())
    with pytest.raises(InvalidRequestError, match="seed"):
        tiny_engine.add_request("r", [100, 200, 300], params, CacheSpec())
    assert not tiny_engine.has_unfinished()


def test_the_widest_seeds_torch_takes_are_served(tiny_engine: Engine) -> None:
    for seed in (2**64 - 1, -(2**63), 2**63 - 1):
        out = tiny_engine.generate([100, 200, 300], SamplingParams(max_tokens=3, temperature=1.0, seed=seed))
        assert len(out.token_ids) == 3


# -- the async engine: admission faults, thread death, a stuck thread -------------------------------


@pytest.fixture
async def engine(tiny_llama_dir):
    eng = AsyncEngine(
        EngineSettings(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.02, num_threads=1),
        clock=ManualClock(),
    )
    await eng.start()
    yield eng
    await eng.shutdown(timeout_s=10)


async def test_an_exception_while_admitting_fails_that_request_alone(engine: AsyncEngine) -> None:
    core = engine.core
    assert core is not None
    add_request = core.add_request

    def faulty(rid: str, prompt: Any, params: Any, cache: Any, **kwargs: Any) -> None:
        if rid == "bad":
            raise RuntimeError("injected admission fault")
        add_request(rid, prompt, params, cache, **kwargs)

    core.add_request = faulty  # type: ignore[method-assign]
    rng = random.Random(8)
    bad = engine.submit(random_prompt(rng, 30), GREEDY, CacheSpec(), request_id="bad")
    good = engine.submit(random_prompt(rng, 30), GREEDY, CacheSpec(), request_id="good")
    out_bad, out_good = await asyncio.wait_for(asyncio.gather(bad.result(), good.result()), 30)
    assert out_bad.finish_reason == "error" and out_bad.error_kind == "internal"
    assert "injected admission fault" in (out_bad.error or "")
    assert checked(out_good).finish_reason == "length"
    assert engine.dead_reason is None
    assert (await asyncio.wait_for(engine.generate(random_prompt(rng, 20), GREEDY), 30)).finish_reason == "length"


class EngineThreadKilled(BaseException):
    """Not an Exception: what only the thread's last-resort handler catches."""


async def test_a_dead_engine_thread_fails_what_is_in_flight_at_once_and_refuses_new_work(
    engine: AsyncEngine,
) -> None:
    core = engine.core
    assert core is not None
    step = core.step
    kill = threading.Event()

    def faulty() -> Any:
        if kill.is_set():
            raise EngineThreadKilled("injected: the engine loop itself broke")
        return step()

    core.step = faulty  # type: ignore[method-assign]
    rng = random.Random(9)
    running = engine.submit(random_prompt(rng, 30), LONG, CacheSpec())
    async for _ in running:
        break  # it is decoding
    queued = [engine.submit(random_prompt(rng, 30), LONG, CacheSpec()) for _ in range(3)]
    killed_at = time.monotonic()
    kill.set()
    outputs = await asyncio.wait_for(asyncio.gather(*(h.result() for h in [running, *queued])), 10)
    elapsed = time.monotonic() - killed_at
    assert elapsed < 5, elapsed  # one step, not a hang
    for out in outputs:
        assert out.finish_reason == "error" and out.error_kind == "unavailable"
        assert "the engine loop itself broke" in (out.error or "")
    assert outputs[0].usage.completion_tokens >= 1  # what it computed is still reported
    assert engine.dead_reason is not None and "EngineThreadKilled" in engine.dead_reason
    with pytest.raises(EngineUnavailableError, match="not running"):
        engine.submit(random_prompt(rng, 30), GREEDY, CacheSpec())
    began = time.monotonic()
    await engine.shutdown(timeout_s=10)
    assert time.monotonic() - began < 10


async def test_shutdown_returns_in_time_and_fails_requests_when_the_engine_thread_is_stuck(
    engine: AsyncEngine,
) -> None:
    core = engine.core
    assert core is not None
    step = core.step
    stuck, entered, release = threading.Event(), threading.Event(), threading.Event()

    def hanging() -> Any:
        if stuck.is_set():
            entered.set()
            release.wait()  # as a kernel that never returns
        return step()

    core.step = hanging  # type: ignore[method-assign]
    rng = random.Random(10)
    handle = engine.submit(random_prompt(rng, 30), LONG, CacheSpec())
    async for _ in handle:
        break
    stuck.set()
    assert await asyncio.to_thread(entered.wait, 30)
    began = time.monotonic()
    try:
        await engine.shutdown(timeout_s=1.0)
        took = time.monotonic() - began
        out = await asyncio.wait_for(handle.result(), 5)
    finally:
        release.set()  # let the thread end, so the test leaves nothing running
    assert took < 5, took
    assert out.finish_reason == "error" and out.error_kind == "unavailable"
    assert out.usage.completion_tokens >= 1 and out.usage.prompt_tokens == 30
