"""Soft pinning: 1-hour blocks are kept over 5-minute ones, but never beyond their share of the pool."""

from __future__ import annotations

import random

from inference.block_pool import BlockPool, KVBlock
from inference.types import CacheRegion, CacheSpec
from tests.inference.helpers import checked, random_prompt
from tests.inference.tiers.helpers import ONE_TOKEN, committed_hashes, locations, run_filler


def cache_blocks(pool: BlockPool, n: int, ttl: int, tag: str, now: float) -> list[KVBlock]:
    blocks = pool.allocate(n, now)
    for i, block in enumerate(blocks):
        assert pool.commit(block, f"{tag}{i}".encode(), (i,), ttl, now)
    for block in blocks:
        pool.release([block], now)
    return blocks


def test_unpinned_blocks_go_first_while_pinned_ones_stay_within_their_share():
    pool = BlockPool(8, pin_share=0.5)
    pinned = cache_blocks(pool, 4, 3600, "p", now=0)
    unpinned = cache_blocks(pool, 4, 300, "u", now=1)
    assert pool.allocate(4, now=2) == unpinned  # older pinned blocks are passed over
    assert pool.allocate(4, now=2) == pinned  # soft: with nothing else left they go too
    pool.check_invariants()


def test_without_pinning_plain_lru_order_holds():
    pool = BlockPool(8, pin_share=0.0)
    pinned = cache_blocks(pool, 4, 3600, "p", now=0)
    cache_blocks(pool, 4, 300, "u", now=1)
    assert pool.allocate(4, now=2) == pinned


def test_pinned_blocks_beyond_their_share_are_evicted_in_lru_order():
    pool = BlockPool(8, pin_share=0.25)  # at most 2 pinned free blocks keep their preference
    pinned = cache_blocks(pool, 5, 3600, "p", now=0)
    unpinned = cache_blocks(pool, 3, 300, "u", now=1)
    # 5 pinned > 2: the 3 oldest pinned go (LRU), then the share holds and unpinned ones go.
    assert pool.allocate(6, now=2) == [*pinned[:3], *unpinned]
    assert pool.num_pinned_free == 2
    pool.check_invariants()


def test_a_one_hour_prefix_stays_on_the_device_while_five_minute_traffic_churns(tiered, tiny_llama_dir):
    for share, kept in ((0.5, True), (0.0, False)):
        engine = tiered(tiny_llama_dir, device=24, host=0, kv_pin_share=share)
        prompt = random_prompt(random.Random(81), 100)
        one_hour = CacheSpec(regions=(CacheRegion(end=100, ttl_s=3600),))
        checked(engine.generate(prompt, ONE_TOKEN, one_hour))
        for _ in range(6):
            run_filler(engine)
        on_device = locations(engine, committed_hashes(engine, prompt)) == {"device"}
        assert on_device == kept
        hit = checked(engine.generate(prompt, ONE_TOKEN, one_hour)).usage.cached_tokens
        assert (hit == 96) == kept
