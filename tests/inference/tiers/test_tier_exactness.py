"""A prefix promoted from a lower tier computes what a cold run does, on KV byte-identical to what was evicted."""

from __future__ import annotations

import random

import pytest
import torch

from inference.types import SamplingParams
from tests.inference.helpers import by_tier, checked, random_prompt
from tests.inference.tiers.helpers import (
    committed_hashes,
    device_kv,
    first_logits,
    locations,
    push_down,
    same_bytes,
)

GREEDY_16 = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("tier", ["host", "disk"])
@pytest.mark.parametrize("model_fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_logits_and_kv_through_every_tier_match_a_cold_run(tiered, request, model_fixture, tier):
    engine = tiered(request.getfixturevalue(model_fixture), device=16, host=12, disk=64)
    prompt = random_prompt(random.Random(31), 150)
    hashes = committed_hashes(engine, prompt)
    cold, cold_out = first_logits(engine, prompt)
    assert cold_out.usage.cache_write_tokens == 144 and len(hashes) == 9
    evicted = device_kv(engine, hashes)

    push_down(engine, hashes, "host")
    host = engine.tiers.tier("host")
    stored = torch.stack([host.buffer[host.index.get(h).slot] for h in hashes])
    assert same_bytes(stored, evicted)
    if tier == "disk":
        push_down(engine, hashes, "disk")  # device -> host -> disk
        assert engine.tiers.tier("host").stats.demotions >= len(hashes)

    warm, warm_out = first_logits(engine, prompt)
    assert warm_out.usage.cached_tokens_by_tier == by_tier(**{tier: 144})
    assert same_bytes(device_kv(engine, hashes), evicted)
    assert torch.allclose(warm, cold, atol=1e-5, rtol=0)
    # The comparison can fail: another prompt's logits are far from these.
    other, _ = first_logits(engine, random_prompt(random.Random(32), 150))
    assert not torch.allclose(other, cold, atol=1e-3, rtol=0)


def test_a_corrupted_restore_would_be_caught(tiered, tiny_llama_dir):
    """The byte comparison above is not vacuous: KV evicted from another prompt's blocks differs."""
    engine = tiered(tiny_llama_dir, device=24)
    a, b = random_prompt(random.Random(33), 150), random_prompt(random.Random(34), 150)
    first_logits(engine, a)
    first_logits(engine, b)
    assert not same_bytes(
        device_kv(engine, committed_hashes(engine, a)), device_kv(engine, committed_hashes(engine, b))
    )


def test_greedy_continuations_through_host_and_disk_equal_cold_bf16(tiered, tiny_qwen2_dir):
    engine = tiered(tiny_qwen2_dir, device=16, host=8, disk=64, dtype="bfloat16")
    rng = random.Random(35)
    for n, tier in ((70, "host"), (150, "disk")):
        prompt = random_prompt(rng, n)
        cold = checked(engine.generate(prompt, GREEDY_16))
        push_down(engine, committed_hashes(engine, prompt), tier)
        warm = checked(engine.generate(prompt, GREEDY_16))
        assert warm.usage.cached_tokens_by_tier[tier] == (n - 1) // 16 * 16
        assert warm.token_ids == cold.token_ids


def test_a_chain_mixing_tiers_is_promoted_in_order(tiered, tiny_llama_dir):
    """Extending a prompt whose prefix sits on disk and whose next blocks sit on the device."""
    engine = tiered(tiny_llama_dir, device=16, host=0, disk=64)
    rng = random.Random(36)
    base = random_prompt(rng, 65)  # commits 4 blocks
    longer = base + random_prompt(rng, 60)
    cold_engine = tiered(tiny_llama_dir, device=64)
    cold, _ = first_logits(cold_engine, longer)

    first_logits(engine, base)
    push_down(engine, committed_hashes(engine, base), "disk")
    warm, out = first_logits(engine, longer)
    assert out.usage.cached_tokens_by_tier == by_tier(disk=64)
    assert torch.allclose(warm, cold, atol=1e-5, rtol=0)
    again, out = first_logits(engine, longer)
    assert out.usage.cached_tokens_by_tier == by_tier(device=112)
    assert torch.allclose(again, cold, atol=1e-5, rtol=0)
    assert locations(engine, committed_hashes(engine, longer)) == {"device"}
