"""Cache reads and writes as the engine reports them: the counts billing is built on."""

from __future__ import annotations

import random

import pytest

from inference.engine import Engine
from inference.types import CacheRegion, CacheSpec, SamplingParams
from tests.inference.helpers import GREEDY, checked, full_blocks_before_last, random_prompt


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33, 100, 257])
def test_repeating_a_prompt_reads_every_full_block_before_the_last_token(tiny_engine: Engine, n: int):
    prompt = random_prompt(random.Random(n), n)
    cold = checked(tiny_engine.generate(prompt, GREEDY))
    warm = checked(tiny_engine.generate(prompt, GREEDY))
    expected = full_blocks_before_last(n)
    assert cold.usage.cached_tokens == 0
    assert cold.usage.cache_write_tokens == expected
    assert warm.usage.cached_tokens == expected
    assert warm.usage.cache_write_tokens == 0
    assert warm.usage.cached_tokens_by_tier["device"] == expected


def test_extending_a_cached_prompt_reads_the_shared_blocks_and_writes_the_rest(tiny_engine: Engine):
    rng = random.Random(1)
    base = random_prompt(rng, 100)
    longer = base + random_prompt(rng, 60)
    checked(tiny_engine.generate(base, GREEDY))
    out = checked(tiny_engine.generate(longer, GREEDY))
    assert out.usage.cached_tokens == 96  # the 6 full blocks base committed
    assert out.usage.cache_write_tokens == full_blocks_before_last(160) - 96
    assert out.usage.uncached_tokens == 160 - 144


def test_a_different_salt_reads_nothing(tiny_engine: Engine):
    prompt = random_prompt(random.Random(2), 80)
    checked(tiny_engine.generate(prompt, GREEDY, CacheSpec(salt="tenant-a")))
    same = checked(tiny_engine.generate(prompt, GREEDY, CacheSpec(salt="tenant-a")))
    other = checked(tiny_engine.generate(prompt, GREEDY, CacheSpec(salt="tenant-b")))
    unsalted = checked(tiny_engine.generate(prompt, GREEDY, CacheSpec()))
    assert same.usage.cached_tokens == 64
    assert other.usage.cached_tokens == 0 and other.usage.cache_write_tokens == 64
    assert unsalted.usage.cached_tokens == 0


def test_regions_commit_only_inside_them_with_the_longest_covering_ttl(tiny_engine: Engine):
    prompt = random_prompt(random.Random(3), 200)
    spec = CacheSpec(regions=(CacheRegion(end=70, ttl_s=3600), CacheRegion(end=150, ttl_s=300)))
    out = checked(tiny_engine.generate(prompt, GREEDY, spec))
    # Blocks ending at or before 70 are 1h (4 blocks), those up to 150 are 5m (5 more).
    assert out.usage.cache_write_tokens_by_ttl == {3600: 64, 300: 80}
    assert out.usage.uncached_tokens == 200 - 144
    warm = checked(tiny_engine.generate(prompt, GREEDY, spec))
    assert warm.usage.cached_tokens == 144 and warm.usage.cache_write_tokens == 0
    # No regions at all: the request may read but commits nothing.
    fresh = random_prompt(random.Random(4), 64)
    none = checked(tiny_engine.generate(fresh, GREEDY, CacheSpec(regions=())))
    again = checked(tiny_engine.generate(fresh, GREEDY, CacheSpec()))
    assert none.usage.cache_write_tokens == 0 and again.usage.cached_tokens == 0
    assert again.usage.cache_write_tokens == 48


def test_ttl_hit_before_expiry_miss_and_rewrite_after_and_hits_refresh(tiny_engine: Engine):
    clock = tiny_engine.clock
    prompt = random_prompt(random.Random(5), 50)
    spec = CacheSpec(regions=(CacheRegion(end=50, ttl_s=300),))
    assert checked(tiny_engine.generate(prompt, GREEDY, spec)).usage.cache_write_tokens == 48
    clock.advance(299)
    assert checked(tiny_engine.generate(prompt, GREEDY, spec)).usage.cached_tokens == 48
    clock.advance(299)  # 598 s after the write, but only 299 s after the refreshing hit
    assert checked(tiny_engine.generate(prompt, GREEDY, spec)).usage.cached_tokens == 48
    clock.advance(301)
    expired = checked(tiny_engine.generate(prompt, GREEDY, spec))
    assert expired.usage.cached_tokens == 0 and expired.usage.cache_write_tokens == 48
    assert checked(tiny_engine.generate(prompt, GREEDY, spec)).usage.cached_tokens == 48


def test_a_1h_reader_extends_a_5m_block(tiny_engine: Engine):
    clock = tiny_engine.clock
    prompt = random_prompt(random.Random(6), 40)
    checked(tiny_engine.generate(prompt, GREEDY, CacheSpec(regions=(CacheRegion(40, 300),))))
    checked(tiny_engine.generate(prompt, GREEDY, CacheSpec(regions=(CacheRegion(40, 3600),))))
    clock.advance(1800)
    assert checked(tiny_engine.generate(prompt, GREEDY)).usage.cached_tokens == 32


def test_requests_sharing_a_long_system_prompt_share_its_blocks(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, kv_cache_gib=0.05, max_num_seqs=128, max_num_batched_tokens=8192)
    rng = random.Random(8)
    system = random_prompt(rng, 2000)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    checked(engine.generate(system + random_prompt(rng, 8), params))
    base_used = engine.pool.num_used
    assert base_used == 0  # everything released, still cached
    cached_before = len(engine.pool.cached)
    for i in range(100):
        engine.add_request(f"r{i}", system + random_prompt(rng, 40), params, CacheSpec())
    peak = 0
    outs = []
    while engine.has_unfinished():
        outs += [o.finished for o in engine.step() if o.finished]
        peak = max(peak, engine.pool.num_used)
    assert len(outs) == 100
    for out in outs:
        checked(out)
        assert out.usage.cached_tokens == 2000 // 16 * 16
    # Each request holds the 125 shared blocks plus ~3 of its own, never a private copy.
    assert 125 < peak <= 125 + 100 * 4
    assert len(engine.pool.cached) - cached_before <= 100 * 2


def test_usage_invariant_holds_under_a_random_workload(make_engine, tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, kv_cache_gib=0.002, max_num_batched_tokens=64)
    rng = random.Random(9)
    prefixes = [random_prompt(rng, rng.randrange(10, 120)) for _ in range(5)]
    for i in range(60):
        prompt = rng.choice(prefixes) + random_prompt(rng, rng.randrange(0, 40))
        salt = rng.choice([None, "a", "b"])
        regions = rng.choice([None, (), (CacheRegion(rng.randrange(0, 150), rng.choice([300, 3600])),)])
        params = SamplingParams(max_tokens=rng.randrange(1, 12), temperature=0, ignore_eos=True)
        engine.add_request(f"r{i}", prompt, params, CacheSpec(salt=salt, regions=regions))
        if rng.random() < 0.3:
            engine.clock.advance(rng.choice([1, 200, 400]))
        for out in engine.step():
            if out.finished:
                checked(out.finished)
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                checked(out.finished)
    engine.pool.check_invariants()
    assert engine.pool.num_used == 0


def test_with_prefix_caching_off_nothing_is_read_or_written(make_engine, tiny_llama_dir):
    prompt = random_prompt(random.Random(10), 70)
    off = make_engine(tiny_llama_dir, enable_prefix_caching=False)
    on = make_engine(tiny_llama_dir)
    for engine, expected in ((off, (0, 0)), (on, (64, 0))):
        checked(engine.generate(prompt, GREEDY))
        again = checked(engine.generate(prompt, GREEDY))
        assert (again.usage.cached_tokens, again.usage.cache_write_tokens) == expected
    assert off.generate(prompt, GREEDY).token_ids == on.generate(prompt, GREEDY).token_ids
