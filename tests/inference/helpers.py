"""Small builders shared by the engine tests."""

from __future__ import annotations

import random

from inference.amx_linear import AmxLinearKernel
from inference.platform import KERNEL_VARIANTS, best_variant, this_cpu
from inference.settings import EngineSettings
from inference.tiers import TIER_NAMES
from inference.types import RequestOutput, SamplingParams, Usage

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def assert_usage_invariant(usage: Usage) -> None:
    assert usage.cached_tokens >= 0 and usage.cache_write_tokens >= 0
    assert usage.cached_tokens + usage.cache_write_tokens + usage.uncached_tokens == usage.prompt_tokens
    assert usage.uncached_tokens >= 0
    assert sum(usage.cache_write_tokens_by_ttl.values()) == usage.cache_write_tokens
    assert sum(usage.cached_tokens_by_tier.values()) == usage.cached_tokens


def by_tier(**tokens: int) -> dict[str, int]:
    """cached_tokens_by_tier as an admitted request reports it: every tier name, zeros included."""
    assert set(tokens) <= set(TIER_NAMES), tokens
    return {name: tokens.get(name, 0) for name in TIER_NAMES}


def full_blocks_before_last(n: int, block_size: int = 16) -> int:
    """What repeating an n-token prompt reads: floor((n - 1) / 16) * 16."""
    return (n - 1) // block_size * block_size


def checked(out: RequestOutput) -> RequestOutput:
    assert_usage_invariant(out.usage)
    return out


def runnable_variants(kernel: str) -> list[str]:
    """The ISA variants of a C kernel (inference/platform.py) that this CPU runs, least capable first."""
    cpu = this_cpu()
    return [isa for isa in KERNEL_VARIANTS[kernel] if cpu.runs(isa)]


def best_kernel_variant(kernel: str) -> str | None:
    """The variant of a C kernel the kernel plan would pick on this CPU, or None where it runs none."""
    return best_variant(kernel, this_cpu())


def planned_amx_linear() -> AmxLinearKernel | None:
    """The AMX linear kernel where the kernel plan runs bf16 linears on it (AMX CPUs), else None (oneDNN)."""
    return AmxLinearKernel.load(EngineSettings().cache_dir) if this_cpu().runs("amx") else None
