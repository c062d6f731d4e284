"""Tier metrics on /metrics: hits per tier in tokens, stores, loads, evictions, bytes moved, occupancy."""

from __future__ import annotations

import random
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from inference.metrics import EngineMetrics
from inference.stats import make_engine_stats
from tests.inference.helpers import checked, random_prompt
from tests.inference.tiers.helpers import ONE_TOKEN, committed_hashes, push_down


def scrape(engine) -> dict[str, float]:
    metrics = EngineMetrics(SimpleNamespace(stats=lambda: make_engine_stats(engine), model_id=engine.model_id))
    text, _ = metrics.render()
    samples = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_tier_metrics_follow_the_traffic(tiered, tiny_llama_dir):
    engine = tiered(tiny_llama_dir, device=16, host=24, disk=64)
    rng = random.Random(91)
    a, b = random_prompt(rng, 100), random_prompt(rng, 100)
    checked(engine.generate(a, ONE_TOKEN))
    checked(engine.generate(b, ONE_TOKEN))
    push_down(engine, committed_hashes(engine, a) + committed_hashes(engine, b), "host")
    checked(engine.generate(a, ONE_TOKEN))  # 96 tokens from the host
    push_down(engine, committed_hashes(engine, b), "disk")
    checked(engine.generate(b, ONE_TOKEN))  # 96 tokens from disk
    checked(engine.generate(b, ONE_TOKEN))  # 96 tokens from the device
    engine.tiers.flush()

    m = scrape(engine)
    host, disk = engine.tiers.tier("host").stats, engine.tiers.tier("disk").stats
    assert m["kvgate:kv_tier_hit_tokens_total{tier=device}"] == 96
    assert m["kvgate:kv_tier_hit_tokens_total{tier=host}"] == 96
    assert m["kvgate:kv_tier_hit_tokens_total{tier=disk}"] == 96
    assert m["kvgate:kv_tier_loads_total{tier=host}"] == 6 == host.loads
    assert m["kvgate:kv_tier_loads_total{tier=disk}"] == 6 == disk.loads
    nbytes = engine.tiers.layout.nbytes
    assert m["kvgate:kv_tier_bytes_read_total{tier=disk}"] == 6 * nbytes
    assert m["kvgate:kv_tier_stores_total{tier=host}"] == host.stores > 0
    assert m["kvgate:kv_tier_stores_total{tier=disk}"] == disk.stores > 0
    assert m["kvgate:kv_tier_bytes_written_total{tier=disk}"] == disk.stores * nbytes
    assert m["kvgate:kv_tier_evictions_total{tier=host}"] == host.evictions > 0
    assert m["kvgate:kv_tier_demotions_total{tier=host}"] == host.demotions > 0
    assert m["kvgate:kv_tier_blocks_used{tier=host}"] == len(engine.tiers.tier("host")) <= 24
    assert m["kvgate:kv_tier_blocks_total{tier=disk}"] == 64
    assert m["kvgate:kv_tier_bytes_used{tier=disk}"] == len(engine.tiers.tier("disk")) * nbytes
    assert m["kvgate:kv_tier_checksum_failures_total{tier=disk}"] == 0
    assert m["kvgate:kv_offload_pending"] == 0
    # The cache-wide counters agree with the per-tier split.
    assert m["vllm:prefix_cache_hits_total"] == 3 * 96


def test_an_engine_without_tiers_reports_device_hits_only(tiered, tiny_llama_dir):
    engine = tiered(tiny_llama_dir, device=16)
    prompt = random_prompt(random.Random(92), 50)
    checked(engine.generate(prompt, ONE_TOKEN))
    checked(engine.generate(prompt, ONE_TOKEN))
    m = scrape(engine)
    assert m["kvgate:kv_tier_hit_tokens_total{tier=device}"] == 48
    assert m["kvgate:kv_tier_hit_tokens_total{tier=host}"] == 0
    assert not any(k.startswith("kvgate:kv_tier_stores") for k in m)
