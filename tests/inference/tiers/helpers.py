"""Helpers for the tier tests: where a prompt's blocks are, pushing them down, and reading KV and logits."""

from __future__ import annotations

import itertools
import random

import torch

from inference.engine import Engine
from inference.hashing import BlockHash
from inference.tiers.layout import device_block
from inference.types import CacheSpec, RequestOutput, SamplingParams
from tests.inference.helpers import checked, random_prompt

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
_filler_seeds = itertools.count(10_000)


def committed_hashes(engine: Engine, prompt: list[int], salt: str | None = None) -> list[BlockHash]:
    """Hashes of the blocks a prompt commits under automatic caching (all full blocks before the last token)."""
    n = (len(prompt) - 1) // engine.block_size
    return engine.hasher.hash_blocks(prompt, salt)[:n]


def location(engine: Engine, block_hash: BlockHash) -> str | None:
    """The fastest tier holding the block: "device", "host", "disk", or None."""
    if block_hash in engine.pool.cached:
        return "device"
    for tier in engine.tiers.tiers if engine.tiers is not None else []:
        if block_hash in tier:
            return tier.name
    return None


def locations(engine: Engine, hashes: list[BlockHash]) -> set[str | None]:
    if engine.tiers is not None:
        engine.tiers.flush()
    return {location(engine, h) for h in hashes}


def run_filler(engine: Engine, n_tokens: int = 97, salt: str = "filler") -> RequestOutput:
    """A unique prompt under its own salt: its commits evict older blocks down the tiers."""
    prompt = random_prompt(random.Random(next(_filler_seeds)), n_tokens)
    return checked(engine.generate(prompt, ONE_TOKEN, CacheSpec(salt=salt)))


def push_down(engine: Engine, hashes: list[BlockHash], tier: str, *, max_fillers: int = 60) -> None:
    """Run fillers until every block of hashes sits in `tier` and no faster one (fails if it never does)."""
    for _ in range(max_fillers):
        if locations(engine, hashes) == {tier}:
            return
        run_filler(engine)
    raise AssertionError(f"blocks never all reached {tier}: {locations(engine, hashes)}")


def device_kv(engine: Engine, hashes: list[BlockHash]) -> torch.Tensor:
    """A copy of the device KV of these (device-resident) blocks, [n, layers, 2, block_size, heads, dim]."""
    cache = engine.kv_tensors.cache
    return torch.stack([device_block(cache, engine.pool.cached[h].block_id).clone() for h in hashes])


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def first_logits(
    engine: Engine, prompt: list[int], cache: CacheSpec | None = None
) -> tuple[torch.Tensor, RequestOutput]:
    """The float32 logits of the first generated token, and the request's output."""
    seen: list[torch.Tensor] = []
    engine.logits_observer = lambda ids, logits: seen.append(logits[0].clone())
    try:
        out = checked(engine.generate(prompt, ONE_TOKEN, cache))
    finally:
        engine.logits_observer = None
    assert len(seen) == 1
    return seen[0], out


def pressure(engine: Engine, num_blocks: int, *, ttl_s: int = 300) -> list[BlockHash]:
    """Commit num_blocks synthetic blocks through the device pool and free them, as a request would.

    Each allocation evicts the pool's LRU block down the tiers exactly as a real prefill
    does, without running the model. Returns the synthetic hashes (oldest first).
    """
    pool, now = engine.pool, engine.clock.now()
    hashes = []
    for _ in range(num_blocks):
        (block,) = pool.allocate(1, now)
        block_hash = random.randbytes(32)
        assert pool.commit(block, block_hash, tuple(range(engine.block_size)), ttl_s, now)
        pool.release([block], now)
        hashes.append(block_hash)
    return hashes
