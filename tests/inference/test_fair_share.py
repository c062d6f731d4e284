"""Fair share across tenants in the engine: deficit round robin over per-tenant queues (inference.scheduler).

Each check is paired: the same workload under one shared key is served first-in first-out,
which is what lets a flood starve a neighbour; under two keys the neighbour is served.
"""

from __future__ import annotations

import random

from inference.types import CacheSpec, FairShare, SamplingParams
from tests.inference.helpers import checked, random_prompt

PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def _flood_then_one(engine, *, flood_key: str, victim_key: str, flood: int = 12, flood_len: int = 400) -> int:
    """Steps until the victim's request (queued after the flood) finishes."""
    rng = random.Random(25)
    for i in range(flood):
        engine.add_request(f"a{i}", random_prompt(rng, flood_len), PARAMS, CacheSpec(), share=FairShare(flood_key))
    engine.add_request("victim", random_prompt(rng, 20), PARAMS, CacheSpec(), share=FairShare(victim_key))
    steps = 0
    while engine.has_unfinished():
        steps += 1
        for out in engine.step():
            if out.finished:
                checked(out.finished)
                if out.request_id == "victim":
                    victim_steps = steps
        engine.pool.check_invariants()
    return victim_steps


def test_a_neighbours_flood_does_not_queue_a_small_request_behind_it(make_engine, tiny_llama_dir):
    settings = {"max_num_batched_tokens": 256, "max_num_seqs": 4}
    shared = _flood_then_one(make_engine(tiny_llama_dir, **settings), flood_key="same", victim_key="same")
    fair = _flood_then_one(make_engine(tiny_llama_dir, **settings), flood_key="flooder", victim_key="victim")
    # One key: the victim waits for the whole flood (12 x 400 tokens at 256 a step: ~19 steps).
    assert shared >= 15, shared
    # Its own key: served within a few steps, ahead of most of the flood.
    assert fair <= 6, (fair, shared)


def test_a_full_set_of_running_slots_gives_one_back_to_a_tenant_with_none(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=512, max_num_seqs=2)
    rng = random.Random(3)
    long = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"a{i}", random_prompt(rng, 40), long, CacheSpec(), share=FairShare("a"))
    engine.step()
    assert len(engine.scheduler.running) == 2  # both slots are a's, decoding for 60 tokens
    engine.add_request("b", random_prompt(rng, 20), PARAMS, CacheSpec(), share=FairShare("b"))
    finished_b = None
    for step in range(1, 20):
        if any(out.request_id == "b" and out.finished for out in engine.step()):
            finished_b = step
            break
    assert finished_b is not None and finished_b <= 8, finished_b
    assert engine.scheduler.num_fair_preemptions == 1
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = checked(out.finished)
    assert {rid: len(o.token_ids) for rid, o in outs.items()} == {"a0": 60, "a1": 60}  # the preempted one resumed


def test_one_tenant_alone_keeps_first_in_first_out_and_the_whole_budget(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=256, fair_prefill_quantum=16)
    rng = random.Random(4)
    for i in range(3):
        engine.add_request(f"r{i}", random_prompt(rng, 200), PARAMS, CacheSpec(), share=FairShare("only"))
    first = engine.scheduler.schedule()
    # r0 up to its last full block (a split point), then r1 with the rest of the budget: no
    # chunk is cut to a quantum (fair_prefill_quantum, 16 here) when nobody contends.
    assert [(c.request.request_id, c.num_tokens) for c in first] == [("r0", 192), ("r1", 64)]


def test_prefill_tokens_split_by_weight_when_tenants_contend(make_engine, tiny_llama_dir):
    engine = make_engine(
        tiny_llama_dir,
        max_num_batched_tokens=512,
        fair_prefill_quantum=64,
        max_num_seqs=16,
        contended_prefill_tokens=None,
    )
    rng = random.Random(5)
    for i in range(4):
        engine.add_request(f"h{i}", random_prompt(rng, 600), PARAMS, CacheSpec(), share=FairShare("heavy", weight=3))
        engine.add_request(f"l{i}", random_prompt(rng, 600), PARAMS, CacheSpec(), share=FairShare("light", weight=1))
    tokens = {"heavy": 0, "light": 0}
    for chunk in engine.scheduler.schedule():
        tokens[chunk.request.share.key] += chunk.num_tokens
    assert tokens["heavy"] + tokens["light"] == 512
    # Weight 3 against 1: three quarters of the budget, to within a quantum.
    assert abs(tokens["heavy"] - 384) <= 64, tokens


def _until_decoding(engine, request_id: str) -> None:
    while not any(o.request_id == request_id and o.token_ids for o in engine.step()):
        pass


def test_a_neighbours_prefill_beside_another_tenants_decode_is_held_to_a_small_chunk(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=512, contended_prefill_tokens=64)
    rng = random.Random(6)
    decoding = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    engine.add_request("b", random_prompt(rng, 20), decoding, CacheSpec(), share=FairShare("b"))
    _until_decoding(engine, "b")
    engine.add_request("mine", random_prompt(rng, 400), PARAMS, CacheSpec(), share=FairShare("b"))
    same_tenant = sum(c.num_tokens for c in engine.scheduler.schedule() if c.request.request_id == "mine")
    assert same_tenant == 384  # b's own prompt beside b's decode: up to its last full block, as before

    other = make_engine(tiny_llama_dir, max_num_batched_tokens=512, contended_prefill_tokens=64)
    other.add_request("b", random_prompt(rng, 20), decoding, CacheSpec(), share=FairShare("b"))
    _until_decoding(other, "b")
    other.add_request("a", random_prompt(rng, 400), PARAMS, CacheSpec(), share=FairShare("a"))
    chunks = other.scheduler.schedule()
    assert [c.request.request_id for c in chunks] == ["b", "a"]
    assert chunks[1].num_tokens == 64  # a neighbour's prompt beside b's decode: a small chunk


def test_a_step_two_tenants_prefill_in_is_held_to_the_contended_budget(make_engine, tiny_llama_dir):
    rng = random.Random(7)
    alone = make_engine(tiny_llama_dir, max_num_batched_tokens=2048, contended_prefill_tokens=256)
    for i in range(3):
        alone.add_request(f"a{i}", random_prompt(rng, 1000), PARAMS, CacheSpec(), share=FairShare("a"))
    assert sum(c.num_tokens for c in alone.scheduler.schedule()) > 1900  # one tenant: the whole budget

    both = make_engine(tiny_llama_dir, max_num_batched_tokens=2048, contended_prefill_tokens=256)
    for i in range(3):
        both.add_request(f"a{i}", random_prompt(rng, 1000), PARAMS, CacheSpec(), share=FairShare("a"))
    both.add_request("b", random_prompt(rng, 20), PARAMS, CacheSpec(), share=FairShare("b"))
    steps = []
    for _ in range(2):
        chunks = both.scheduler.schedule()
        steps.append([c.request.request_id for c in chunks])
        assert sum(c.num_tokens for c in chunks) <= 256
        for chunk in chunks:  # as if the pass ran
            chunk.request.num_computed_tokens += chunk.num_tokens
    assert "b" in steps[0] + steps[1], steps  # the small request gets its turn within two short steps
