"""A damaged block on disk is a miss: dropped, recomputed, never loaded; the output stays correct."""

from __future__ import annotations

import random

from inference.engine import Engine
from inference.hashing import BlockHash
from inference.tiers.disk_format import payload_offset
from inference.types import SamplingParams
from tests.inference.helpers import by_tier, checked, random_prompt
from tests.inference.tiers.helpers import committed_hashes, push_down

GREEDY_16 = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


def flip_payload_byte(engine: Engine, block_hash: BlockHash) -> None:
    disk = engine.tiers.tier("disk")
    entry = disk.index.get(block_hash)
    segment, index = divmod(entry.slot, disk.slots_per_segment)
    offset = index * disk.record_size + payload_offset(engine.block_size) + 777
    with open(disk.dir / f"seg-{segment:06d}.kvs", "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def test_a_flipped_byte_makes_that_block_a_miss_and_it_is_recomputed(tiered, tiny_llama_dir):
    engine = tiered(tiny_llama_dir, device=16, disk=64)
    rng = random.Random(51)
    damaged, intact = random_prompt(rng, 150), random_prompt(rng, 150)
    cold = {i: checked(engine.generate(p, GREEDY_16)).token_ids for i, p in enumerate((damaged, intact))}
    hashes = committed_hashes(engine, damaged)
    push_down(engine, hashes + committed_hashes(engine, intact), "disk")
    flip_payload_byte(engine, hashes[2])

    out = checked(engine.generate(damaged, GREEDY_16))
    # Blocks 0 and 1 still load; block 2 fails its checksum, so the chain stops there.
    assert out.usage.cached_tokens_by_tier == by_tier(disk=32)
    assert out.usage.cache_write_tokens == 144 - 32
    assert out.token_ids == cold[0]
    assert engine.tiers.tier("disk").stats.checksum_failures == 1
    assert hashes[2] in engine.pool.cached  # recomputed and committed on the device afresh
    # Paired positive: the undamaged prompt reads all of its blocks from disk.
    ok = checked(engine.generate(intact, GREEDY_16))
    assert ok.usage.cached_tokens_by_tier == by_tier(disk=144) and ok.token_ids == cold[1]


def test_damage_in_the_first_block_reads_nothing(tiered, tiny_llama_dir):
    engine = tiered(tiny_llama_dir, device=16, host=0, disk=64)
    prompt = random_prompt(random.Random(52), 100)
    cold = checked(engine.generate(prompt, GREEDY_16))
    hashes = committed_hashes(engine, prompt)
    push_down(engine, hashes, "disk")
    flip_payload_byte(engine, hashes[0])
    out = checked(engine.generate(prompt, GREEDY_16))
    assert out.usage.cached_tokens == 0 and out.usage.cache_write_tokens == 96
    assert out.token_ids == cold.token_ids
