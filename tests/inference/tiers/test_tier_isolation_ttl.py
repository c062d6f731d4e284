"""Salts isolate in every tier, and an entry that expired in a lower tier is neither promoted nor read."""

from __future__ import annotations

import random

import pytest

from inference.clock import ManualClock
from inference.engine import Engine
from inference.types import CacheRegion, CacheSpec, SamplingParams
from tests.inference.helpers import by_tier, checked, random_prompt
from tests.inference.tiers.helpers import committed_hashes, locations, push_down

GREEDY_8 = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_a_different_salt_never_hits_in_any_tier(tiered, tiny_llama_dir, tier):
    sizes = {"host": {"host": 48}, "disk": {"disk": 64}}[tier]  # one lower tier, large enough to keep them all
    engine = tiered(tiny_llama_dir, device=16, **sizes)
    prompt = random_prompt(random.Random(71), 150)
    alice = CacheSpec(salt="alice")
    cold = checked(engine.generate(prompt, GREEDY_8, alice))
    push_down(engine, committed_hashes(engine, prompt, "alice"), tier)

    for other in (CacheSpec(salt="bob"), CacheSpec()):
        out = checked(engine.generate(prompt, GREEDY_8, other))
        assert out.usage.cached_tokens == 0 and out.usage.cache_write_tokens == 144
        assert locations(engine, committed_hashes(engine, prompt, "alice")) == {tier}
        same = checked(engine.generate(prompt, GREEDY_8, alice))
        assert same.usage.cached_tokens_by_tier == by_tier(**{tier: 144})
        assert same.token_ids == cold.token_ids
        push_down(engine, committed_hashes(engine, prompt, "alice"), tier)


@pytest.mark.parametrize("tier", ["host", "disk"])
def test_an_entry_that_expired_in_a_lower_tier_is_not_promoted_or_counted(tiered, tiny_llama_dir, tier):
    # Pinning off, so that fillers push the 1-hour blocks down as fast as the 5-minute ones.
    engine = tiered(tiny_llama_dir, device=16, host=24, disk=96, kv_pin_share=0.0)
    rng = random.Random(72)
    short, long = random_prompt(rng, 100), random_prompt(rng, 100)
    one_hour = CacheSpec(regions=(CacheRegion(end=100, ttl_s=3600),))
    cold = checked(engine.generate(short, GREEDY_8))  # the default 5-minute TTL
    checked(engine.generate(long, GREEDY_8, one_hour))
    hashes_short, hashes_long = committed_hashes(engine, short), committed_hashes(engine, long)
    push_down(engine, hashes_short + hashes_long, tier)
    engine.clock.advance(301)

    out = checked(engine.generate(short, GREEDY_8))
    assert out.usage.cached_tokens == 0 and out.usage.cached_tokens_by_tier == by_tier()
    assert out.usage.cache_write_tokens == 96  # recomputed and written again
    assert out.token_ids == cold.token_ids
    tier_stats = engine.tiers.tier(tier).stats
    assert tier_stats.loads == 0 and tier_stats.evictions >= 1  # the stale entry was dropped, not loaded
    # Paired positive: the 1-hour entry, as old, is still read from the same tier.
    hit = checked(engine.generate(long, GREEDY_8, one_hour))
    assert hit.usage.cached_tokens_by_tier == by_tier(**{tier: 96})


def test_a_disk_entry_that_expired_while_the_engine_was_down_is_purged(tiered, tiny_llama_dir, tmp_path):
    first = tiered(tiny_llama_dir, device=16, disk=64, disk_dir=tmp_path / "kv")
    start = first.clock.now()
    prompt = random_prompt(random.Random(73), 100)
    checked(first.generate(prompt, GREEDY_8))
    push_down(first, committed_hashes(first, prompt), "disk")
    first.close()

    def restart(at: float) -> Engine:
        settings = first.settings.model_copy()
        return Engine(settings, clock=ManualClock(start=at), loaded=first.loaded)

    soon = restart(start + 299)
    assert soon.tiers.tier("disk").num_purged_at_start == 0
    assert checked(soon.generate(prompt, GREEDY_8)).usage.cached_tokens_by_tier["disk"] == 96
    soon.close()
    late = restart(start + 10_000)
    try:
        assert late.tiers.tier("disk").num_purged_at_start > 0 and len(late.tiers.tier("disk")) == 0
        assert checked(late.generate(prompt, GREEDY_8)).usage.cached_tokens == 0
    finally:
        late.close()
