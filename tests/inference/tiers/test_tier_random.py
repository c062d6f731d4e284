"""A randomized workload over small tiers, with the offload worker running alongside: outputs stay exact,
accounting stays true, and every tier keeps its invariants."""

from __future__ import annotations

import random

from inference.engine import Engine
from inference.types import CacheRegion, CacheSpec, SamplingParams
from tests.inference.helpers import checked, random_prompt

GREEDY_4 = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def check_tiers(engine: Engine) -> None:
    engine.pool.check_invariants()
    host, disk = engine.tiers.tier("host"), engine.tiers.tier("disk")
    assert len(host) + len(host._free_slots) == host.capacity
    assert {e.slot for e in host.index} | set(host._free_slots) == set(range(host.capacity))
    assert all(e.locks == 0 for e in host.index)
    engine.tiers.flush()
    assert len(disk) + len(disk._free_slots) == disk.capacity
    assert {e.slot for e in disk.index}.isdisjoint(disk._free_slots)
    assert all(e.locks == 0 for e in disk.index)


def test_random_traffic_through_small_tiers_stays_exact(tiered, tiny_llama_dir):
    engine = tiered(tiny_llama_dir, device=20, host=10, disk=30, kv_offload_staging_mib=0.05)
    reference = tiered(tiny_llama_dir, device=256)
    rng = random.Random(101)
    stems = [random_prompt(rng, rng.choice([40, 70, 110])) for _ in range(6)]
    expected: dict[tuple[int, ...], tuple[int, ...]] = {}
    read_by_tier = {"device": 0, "host": 0, "disk": 0}
    for step in range(60):
        prompt = rng.choice(stems) + random_prompt(rng, rng.randrange(1, 40))
        if rng.random() < 0.3:
            prompt = rng.choice(stems)
        salt = rng.choice([None, "t1", "t2"])
        regions = rng.choice([None, (CacheRegion(end=len(prompt), ttl_s=rng.choice([300, 3600])),)])
        cache = CacheSpec(salt=salt, regions=regions)
        out = checked(engine.generate(prompt, GREEDY_4, cache))
        key = tuple(prompt)
        if key not in expected:
            expected[key] = checked(reference.generate(prompt, GREEDY_4)).token_ids
        assert out.token_ids == expected[key], f"step {step}"
        for tier in read_by_tier:
            read_by_tier[tier] += out.usage.cached_tokens_by_tier[tier]
        if step % 10 == 9:
            check_tiers(engine)
        if rng.random() < 0.1:
            engine.clock.advance(rng.choice([30, 200, 400]))
    check_tiers(engine)
    # The workload did exercise every tier.
    assert all(read_by_tier.values()), read_by_tier
    assert engine.tiers.tier("host").stats.demotions > 0 and engine.tiers.tier("disk").stats.evictions > 0
