"""Under a stream of unique prefixes no tier exceeds its capacity, and blocks age device -> host -> disk -> gone."""

from __future__ import annotations

import random

from tests.inference.helpers import checked, random_prompt
from tests.inference.tiers.helpers import ONE_TOKEN, committed_hashes, location, pressure

RANK = {None: 0, "disk": 1, "host": 2, "device": 3}


def test_a_stream_of_unique_prefixes_keeps_every_tier_within_its_limit_in_lru_order(tiered, tiny_llama_dir):
    engine = tiered(tiny_llama_dir, device=16, host=10, disk=20)
    tiers = engine.tiers
    host, disk = tiers.tier("host"), tiers.tier("disk")
    rng = random.Random(61)
    prompts = [random_prompt(rng, 97) for _ in range(14)]  # 6 committed blocks each, 84 in all
    order: list[list[bytes]] = []
    for prompt in prompts:
        checked(engine.generate(prompt, ONE_TOKEN))
        order.append(committed_hashes(engine, prompt))
        assert len(host) <= 10 and len(disk) <= 20
        assert sum(p.stat().st_size for p in disk.dir.glob("seg-*.kvs")) <= 20 * disk.record_size
    tiers.flush()
    assert len(host) == 10 and len(disk) == 20

    # Older prompts sit in slower tiers: the first ones are gone, the last one is on the device.
    ranks = [max(RANK[location(engine, h)] for h in hashes) for hashes in order]
    assert ranks == sorted(ranks) and ranks[0] == 0 and ranks[-1] == 3
    assert {location(engine, h) for hashes in order for h in hashes} == {None, "disk", "host", "device"}
    # Within each tier, LRU order follows prompt order (older prompts are evicted first).
    prompt_of = {h: i for i, hashes in enumerate(order) for h in hashes}
    for tier in (host, disk):
        seq = [prompt_of[e.block_hash] for e in tier.index.lru_order()]
        assert seq == sorted(seq)
    assert host.stats.evictions == host.stats.demotions > 0
    assert disk.stats.evictions > 0


def test_a_hit_in_the_host_tier_makes_it_most_recent_there(tiered, tiny_llama_dir):
    engine = tiered(tiny_llama_dir, device=16, host=24)
    rng = random.Random(62)
    a, b = random_prompt(rng, 97), random_prompt(rng, 97)
    for prompt in (a, b):
        checked(engine.generate(prompt, ONE_TOKEN))
    hashes_a, hashes_b = committed_hashes(engine, a), committed_hashes(engine, b)
    pressure(engine, 16)  # both prompts move to the host, a's blocks first
    host = engine.tiers.tier("host")
    lru = [e.block_hash for e in host.index.lru_order()]
    assert set(lru[:6]) == set(hashes_a) and set(lru[6:12]) == set(hashes_b)
    out = checked(engine.generate(a, ONE_TOKEN))
    assert out.usage.cached_tokens_by_tier["host"] == 96
    lru = [e.block_hash for e in host.index.lru_order()]
    assert set(lru[-6:]) == set(hashes_a) and set(lru[:6]) == set(hashes_b)


def test_expired_blocks_are_never_written_down(tiered, tiny_llama_dir):
    engine = tiered(tiny_llama_dir, device=16, host=8, disk=16)
    stale = pressure(engine, 8, ttl_s=300)
    engine.clock.advance(301)
    pressure(engine, 16)  # evicts every stale block (expired ones first)
    engine.tiers.flush()
    assert not any(location(engine, h) for h in stale)
    assert engine.pool.num_expired_evictions == 8 and engine.tiers.tier("host").stats.stores == 0
    # Paired positive: live blocks evicted the same way are stored.
    live = pressure(engine, 8)
    assert engine.tiers.tier("host").stats.stores == 8 and not any(location(engine, h) for h in live[:0])


def test_sizes_in_gib_are_limits_on_the_bytes_each_tier_holds(tiered, tiny_llama_dir, tmp_path):
    gib = 2**-14  # 64 KiB: 4 host blocks of 16 KiB; 3 disk records of 16 KiB + a 4 KiB header page
    engine = tiered(
        tiny_llama_dir, device=16, kv_host_blocks=None, kv_host_gib=gib, kv_disk_dir=tmp_path, kv_disk_gib=gib
    )
    tiers = engine.tiers
    host, disk = tiers.tier("host"), tiers.tier("disk")
    assert host.capacity * tiers.layout.nbytes <= gib * 2**30 < (host.capacity + 1) * tiers.layout.nbytes
    assert disk.capacity * disk.record_size <= gib * 2**30 < (disk.capacity + 1) * disk.record_size
    assert (host.capacity, disk.capacity) == (4, 3)
