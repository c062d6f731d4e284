"""The real model in bf16: a prefix restored from disk is byte-identical and the greedy output unchanged."""

from __future__ import annotations

import random

import pytest

from inference.types import SamplingParams
from tests.inference.helpers import by_tier, checked, random_prompt
from tests.inference.tiers.helpers import committed_hashes, device_kv, push_down, run_filler, same_bytes

GREEDY_16 = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.mark.smollm2
def test_smollm2_bf16_through_host_and_disk_and_a_restart(tiered, smollm2_dir, tmp_path):
    engine = tiered(smollm2_dir, device=24, host=8, disk=128, dtype="bfloat16", disk_dir=tmp_path / "kv")
    prompt = random_prompt(random.Random(111), 300)
    cold = checked(engine.generate(prompt, GREEDY_16))
    hashes = committed_hashes(engine, prompt)
    evicted = device_kv(engine, hashes)
    push_down(engine, hashes, "disk", max_fillers=30)
    assert engine.tiers.tier("host").stats.demotions > 0  # they went device -> host -> disk
    warm = checked(engine.generate(prompt, GREEDY_16))
    assert warm.usage.cached_tokens_by_tier == by_tier(disk=288)
    assert warm.token_ids == cold.token_ids
    assert same_bytes(device_kv(engine, hashes), evicted)

    run_filler(engine, 300)
    engine.close()
    restarted = tiered(smollm2_dir, device=24, host=8, disk=128, dtype="bfloat16", disk_dir=tmp_path / "kv")
    again = checked(restarted.generate(prompt, GREEDY_16))
    assert again.usage.cached_tokens_by_tier["disk"] == 288 and again.token_ids == cold.token_ids
