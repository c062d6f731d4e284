"""At shutdown the live blocks above the disk are written down, and refreshed expiries reach the disk's headers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from inference.clock import ManualClock
from inference.engine import Engine
from inference.types import SamplingParams
from tests.inference.helpers import by_tier, checked, random_prompt
from tests.inference.tiers.helpers import committed_hashes, locations, push_down

GREEDY_8 = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def restart(first: Engine, at: float, **overrides: object) -> Engine:
    """A new engine on the first one's settings and disk directory, its clock at `at`."""
    settings = first.settings.model_copy(update=overrides)
    return Engine(settings, clock=ManualClock(start=at), loaded=first.loaded)


@pytest.mark.parametrize("tier", ["device", "host"])
def test_blocks_above_the_disk_are_written_out_at_close_and_read_after_a_restart(
    tiered, tiny_llama_dir, tmp_path: Path, tier: str
):
    runs: dict[bool, tuple[dict[str, int], list[int], list[int]]] = {}
    for write_out in (True, False):
        first = tiered(
            tiny_llama_dir, device=16, host=24, disk=64, disk_dir=tmp_path / f"kv-{write_out}",
            kv_disk_write_out_on_close=write_out,
        )  # fmt: skip
        prompt = random_prompt(random.Random(91), 150)
        cold = checked(first.generate(prompt, GREEDY_8))
        hashes = committed_hashes(first, prompt)
        if tier == "host":
            push_down(first, hashes, "host")
        assert locations(first, hashes) == {tier}  # never evicted to disk while the engine ran
        first.close()
        second = restart(first, first.clock.now() + 60)
        warm = checked(second.generate(prompt, GREEDY_8))
        second.close()
        runs[write_out] = (warm.usage.cached_tokens_by_tier, warm.token_ids, cold.token_ids)
    tiers, warm_ids, cold_ids = runs[True]
    assert tiers == by_tier(disk=144) and warm_ids == cold_ids
    # Paired negative: without the write-out the restarted engine has nothing to read.
    tiers, warm_ids, cold_ids = runs[False]
    assert tiers == by_tier() and warm_ids == cold_ids


def test_an_expiry_extended_by_a_hit_survives_a_restart(tiered, tiny_llama_dir, tmp_path: Path):
    # No write-out at close: this is about the headers of blocks already on disk.
    first = tiered(tiny_llama_dir, device=16, disk=96, disk_dir=tmp_path / "kv", kv_disk_write_out_on_close=False)
    start = first.clock.now()
    rng = random.Random(92)
    used, idle = random_prompt(rng, 100), random_prompt(rng, 100)
    for prompt in (used, idle):
        checked(first.generate(prompt, GREEDY_8))
    push_down(first, committed_hashes(first, used) + committed_hashes(first, idle), "disk")

    first.clock.advance(200)  # both expire at about start + 300; a hit now moves `used` to start + 500
    hit = checked(first.generate(used, GREEDY_8))
    assert hit.usage.cached_tokens_by_tier == by_tier(disk=96)
    push_down(first, committed_hashes(first, used), "disk")  # re-evicted: the disk entry is refreshed
    first.close()

    second = restart(first, start + 400)
    try:
        assert checked(second.generate(used, GREEDY_8)).usage.cached_tokens_by_tier == by_tier(disk=96)
        # Paired negative: the prompt not used since it was written expired while the engine was down.
        assert checked(second.generate(idle, GREEDY_8)).usage.cached_tokens == 0
        assert second.tiers.tier("disk").num_purged_at_start > 0
    finally:
        second.close()
