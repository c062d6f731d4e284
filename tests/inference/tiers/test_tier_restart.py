"""The disk tier survives an engine restart: a new engine on the same directory reads what the last one wrote."""

from __future__ import annotations

import asyncio
import random
import threading

from inference.async_engine import AsyncEngine
from inference.settings import EngineSettings
from inference.tiers.disk_tier import DiskTier
from inference.tiers.layout import BlockLayout
from inference.types import SamplingParams
from tests.inference.helpers import by_tier, checked, random_prompt
from tests.inference.tiers.helpers import committed_hashes, push_down, run_filler

GREEDY_16 = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


def test_a_new_engine_on_the_same_directory_reads_from_disk(tiered, tiny_llama_dir, tmp_path):
    first = tiered(tiny_llama_dir, device=16, host=8, disk=64, disk_dir=tmp_path / "kv")
    prompt = random_prompt(random.Random(41), 150)
    cold = checked(first.generate(prompt, GREEDY_16))
    push_down(first, committed_hashes(first, prompt), "disk")
    first.close()

    second = tiered(tiny_llama_dir, device=16, host=8, disk=64, disk_dir=tmp_path / "kv")
    warm = checked(second.generate(prompt, GREEDY_16))
    assert warm.usage.cached_tokens_by_tier == by_tier(disk=144)
    assert warm.token_ids == cold.token_ids
    # Paired negative: an engine on an empty directory reads nothing.
    fresh = tiered(tiny_llama_dir, device=16, host=8, disk=64, disk_dir=tmp_path / "empty")
    assert checked(fresh.generate(prompt, GREEDY_16)).usage.cached_tokens == 0


def test_blocks_still_on_their_way_to_disk_are_written_before_close_returns(tiered, tiny_llama_dir, tmp_path):
    first = tiered(tiny_llama_dir, device=16, disk=64, disk_dir=tmp_path / "kv")
    prompt = random_prompt(random.Random(42), 150)
    first.generate(prompt, GREEDY_16)
    hashes = committed_hashes(first, prompt)
    # Hold the worker so that blocks are still queued when close() is called.
    gate, write = threading.Event(), first.tiers.tier("disk").write
    first.tiers.tier("disk").write = lambda entry, data: (gate.wait(), write(entry, data))
    for _ in range(20):
        if not any(h in first.pool.cached for h in hashes):
            break
        run_filler(first)
    assert not any(h in first.pool.cached for h in hashes)
    assert first.tiers.num_pending_stores >= len(hashes)
    threading.Timer(0.2, gate.set).start()
    first.close()  # no flush before: close drains the worker
    second = tiered(tiny_llama_dir, device=16, disk=64, disk_dir=tmp_path / "kv")
    assert all(h in second.tiers.tier("disk") for h in hashes)


def test_async_engine_shutdown_flushes_and_releases_the_disk_tier(tiny_llama_dir, tmp_path):
    settings = EngineSettings(
        model=str(tiny_llama_dir), dtype="float32", kv_cache_blocks=16, kv_disk_dir=tmp_path, kv_disk_blocks=64
    )

    async def run() -> tuple[list[bytes], BlockLayout]:
        engine = AsyncEngine(settings)
        await engine.start()
        prompts = [random_prompt(random.Random(43 + i), 97) for i in range(6)]
        for prompt in prompts:
            await engine.generate(prompt, GREEDY_16)
        core = engine.core
        evicted = [h for p in prompts for h in committed_hashes(core, p) if h not in core.pool.cached]
        await engine.shutdown()
        return evicted, core.tiers.layout

    evicted, layout = asyncio.run(run())
    assert evicted
    # The disk's layout key holds the engine's kernel plan: the same shape under another plan is another dir.
    assert layout == _layout_of(tiny_llama_dir, compute=layout.compute) and layout.compute
    disk = DiskTier(tmp_path, layout, 64, clock=_clock(), pin_min_ttl_s=3600, pin_share=0.5)
    try:
        assert all(h in disk for h in evicted)
    finally:
        disk.close()


def _layout_of(model_dir, compute: str = ""):
    import torch

    from inference.tiers.layout import BlockLayout
    from tests.model_fixtures import TINY_COMMON

    c = TINY_COMMON
    shape = (c["num_hidden_layers"], 2, 16, c["num_key_value_heads"], c["head_dim"])
    return BlockLayout(shape, torch.float32, compute)


def _clock():
    import time

    from inference.clock import ManualClock

    return ManualClock(time.time())
