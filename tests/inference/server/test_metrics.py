"""/metrics: vLLM-named engine metrics read at scrape time, on a registry per app."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from inference.async_engine import AsyncEngine
from inference.server import create_app
from tests.inference.server.conftest import RunningServer, serve, tiny_settings
from tests.inference.server.helpers import expected_hit, token_prompt, unique_salt

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
FINISHED_LENGTH = "vllm:request_success_total{finished_reason=length}"


def wait_for(server: RunningServer, name: str, at_least: float, timeout: float = 10) -> dict[str, float]:
    """Scrape until a sample reaches a value: request metrics are recorded just after the response."""
    deadline = time.monotonic() + timeout
    while True:
        samples = server.metrics()
        if samples.get(name, 0) >= at_least or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_prefix_cache_queries_and_hits_count_tokens(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    before = tiny_server.metrics()
    prompt, salt = token_prompt(50, seed=21), unique_salt()
    for _ in range(2):
        client.completions.create(
            model=tiny_server.engine.model_id,
            prompt=prompt,
            max_tokens=2,
            temperature=0,
            extra_body={"cache_salt": salt, "ignore_eos": True},
        )
    after = wait_for(tiny_server, FINISHED_LENGTH, before.get(FINISHED_LENGTH, 0) + 2)
    assert after[QUERIES] - before[QUERIES] == 100
    assert after[HITS] - before[HITS] == expected_hit(50)
    # Request metrics have no sample until their first request.
    assert after[TTFT_COUNT] - before.get(TTFT_COUNT, 0) == 2
    assert after[FINISHED_LENGTH] - before.get(FINISHED_LENGTH, 0) == 2
    assert after["vllm:prompt_tokens_total"] - before.get("vllm:prompt_tokens_total", 0) == 100
    assert after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0) == 4


def test_pool_and_queue_gauges(tiny_server: RunningServer) -> None:
    samples = tiny_server.metrics()
    total = samples["kvgate:kv_blocks_total"]
    assert total == tiny_server.engine.core.pool.num_blocks
    assert samples["kvgate:kv_blocks_used"] + samples["kvgate:kv_blocks_free"] == total
    assert samples["vllm:kv_cache_usage_perc"] == samples["kvgate:kv_blocks_used"] / total
    assert samples["vllm:num_requests_running"] == 0
    assert samples["vllm:num_requests_waiting"] == 0
    assert "vllm:num_preemptions_total" in samples
    assert "kvgate:kv_evictions_total" in samples


@pytest.fixture(scope="module")
def small_pool_server(tiny_llama_dir: Path) -> Iterator[RunningServer]:
    # 16 KiB per block on the tiny model: a pool of 24 blocks.
    with serve(tiny_settings(tiny_llama_dir, kv_cache_gib=24 * 16 * 1024 / 2**30)) as server:
        yield server


def test_evictions_count_reused_cached_blocks(small_pool_server: RunningServer) -> None:
    server = small_pool_server
    assert server.metrics()["kvgate:kv_blocks_total"] == 24
    client = server.client()
    for seed in range(2):  # 2 x 6 committed blocks fit beside the empty ones: no eviction yet
        client.completions.create(model=server.engine.model_id, prompt=token_prompt(100, seed), max_tokens=1)
    assert server.metrics()["kvgate:kv_evictions_total"] == 0
    for seed in range(2, 6):
        client.completions.create(model=server.engine.model_id, prompt=token_prompt(100, seed), max_tokens=1)
    samples = server.metrics()
    assert samples["kvgate:kv_evictions_total"] > 0
    assert samples["kvgate:kv_blocks_used"] == 0  # nothing running: every block is free, cached or empty


def test_each_app_has_its_own_registry(tiny_llama_dir: Path) -> None:
    settings = tiny_settings(tiny_llama_dir)
    apps = [create_app(AsyncEngine(settings)) for _ in range(2)]
    registries = [app.state.kvgate.metrics.registry for app in apps]
    assert registries[0] is not registries[1]
    for app in apps:  # engines not started yet: the request metrics alone, and no clash
        body, _ = app.state.kvgate.metrics.render()
        assert b"vllm:time_to_first_token_seconds" in body
        assert b"vllm:prefix_cache_queries" not in body
