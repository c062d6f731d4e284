"""Continuous batching under pressure: chunked prefill, preemption, and requests that can never fit."""

from __future__ import annotations

import random

import pytest

from inference.types import CacheSpec, InvalidRequestError, SamplingParams
from tests.inference.helpers import checked, random_prompt


def run_all(engine, requests):
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params, CacheSpec())
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = checked(out.finished)
        engine.pool.check_invariants()
    return outs


def test_a_full_pool_preempts_and_every_request_still_finishes_correctly(make_engine, tiny_llama_dir):
    rng = random.Random(21)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    requests = [(f"r{i}", random_prompt(rng, rng.randrange(30, 90)), params) for i in range(8)]
    roomy = make_engine(tiny_llama_dir)
    solo = {rid: roomy.generate(prompt, params).token_ids for rid, prompt, _ in requests}

    # 24 blocks of 16 tokens: fewer than the 8 requests need together (8 x ~8 blocks).
    tight = make_engine(tiny_llama_dir, kv_cache_blocks=24, max_num_batched_tokens=64)
    assert tight.pool.num_blocks == 24
    outs = run_all(tight, requests)
    assert tight.scheduler.num_preemptions > 0
    assert {rid: out.token_ids for rid, out in outs.items()} == solo
    assert tight.pool.num_used == 0


def test_a_long_prompt_is_prefilled_in_chunks_while_decodes_continue(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=32)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    engine.add_request("short", random_prompt(random.Random(1), 10), params, CacheSpec())
    engine.step()  # short is prefilled and starts decoding
    engine.add_request("long", random_prompt(random.Random(2), 300), params, CacheSpec())
    decoded_during_prefill = 0
    while engine.scheduler.running and any(
        r.request_id == "long" and r.num_computed_tokens < 300
        for r in engine.scheduler.running + list(engine.scheduler.waiting)
    ):
        decoded_during_prefill += sum(1 for o in engine.step() if o.request_id == "short")
    # 300 tokens at 31 a step take ~10 steps; short decoded in each of them.
    assert decoded_during_prefill >= 9


def test_a_request_that_can_never_fit_is_refused_with_a_clear_error(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, kv_cache_blocks=4)
    with pytest.raises(InvalidRequestError, match="KV blocks"):
        engine.add_request("big", random_prompt(random.Random(3), 100), SamplingParams(), CacheSpec())
    out = engine.generate(random_prompt(random.Random(4), 20), SamplingParams(max_tokens=5, ignore_eos=True))
    assert out.usage.completion_tokens == 5  # and the engine still serves what fits


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ([], SamplingParams(), "empty"),
        ([1] * 5000, SamplingParams(), "context"),
        ([-1, 5], SamplingParams(), "token ids"),
        ([10**9], SamplingParams(), "token ids"),
        ([5, 6], SamplingParams(max_tokens=0), "max_tokens"),
        ([5, 6], SamplingParams(temperature=-1), "temperature"),
        ([5, 6], SamplingParams(top_p=0), "top_p"),
        ([5, 6], SamplingParams(top_k=-2), "top_k"),
    ],
)
def test_bad_requests_are_refused_and_the_engine_keeps_serving(tiny_engine, prompt, params, message):
    with pytest.raises(InvalidRequestError, match=message):
        tiny_engine.add_request("bad", prompt, params, CacheSpec())
    assert not tiny_engine.has_unfinished()
    assert tiny_engine.generate([5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True)).usage.completion_tokens == 2


def test_max_tokens_is_clamped_to_the_context(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_model_len=64)
    out = engine.generate(random_prompt(random.Random(5), 60), SamplingParams(max_tokens=100, ignore_eos=True))
    assert out.finish_reason == "length" and out.usage.completion_tokens == 4
