"""Two engine servers on one Redis: what one computed, the other reads, and says so in its usage and metrics."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import inference.engine
from tests.inference.server.conftest import RunningServer, serve, tiny_settings
from tests.inference.server.helpers import token_prompt, unique_salt

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def two_servers(tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RunningServer, RunningServer]]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("Redis is not reachable at 127.0.0.1:6379")
    suffix = f"t{uuid.uuid4().hex[:12]}"  # this test's keys only (see tests/inference/tiers/conftest.py)
    real = inference.engine.model_fingerprint
    monkeypatch.setattr(inference.engine, "model_fingerprint", lambda *a, **kw: f"{real(*a, **kw)}-{suffix}")
    settings = tiny_settings(tiny_llama_dir, kv_redis_url=REDIS_URL, kv_redis_timeout_ms=10_000)
    try:
        with serve(settings) as a, serve(settings) as b:
            yield a, b
    finally:
        keys = list(client.scan_iter(match=f"kvg:v2:*-{suffix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def _details(server: RunningServer, prompt: list[int], salt: str) -> dict:
    out = server.client().completions.create(
        model=server.engine.model_id, prompt=prompt, temperature=0, max_tokens=4, extra_body={"cache_salt": salt}
    )
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    return {"text": out.choices[0].text, **out.usage.prompt_tokens_details.model_dump()}


def test_a_second_engine_server_reads_the_prefix_the_first_computed(two_servers):
    a, b = two_servers
    prompt, salt = token_prompt(100, seed=21), unique_salt()
    cold = _details(a, prompt, salt)
    a.engine.core.tiers.flush()  # the write-through was queued before A answered; wait until it is sent
    warm = _details(b, prompt, salt)
    assert cold["cached_tokens"] == 0 and cold["cache_write_tokens"] == 96
    assert warm["cached_tokens_by_tier"] == {"device": 0, "host": 0, "disk": 0, "redis": 96}
    assert warm["cached_tokens"] == 96 and warm["cache_write_tokens"] == 0 and warm["text"] == cold["text"]
    assert b.metrics()["kvgate:kv_tier_hit_tokens_total{tier=redis}"] == 96
    # Paired negative: another tenant's identical prompt on B reads nothing, from Redis or anywhere.
    other = _details(b, prompt, unique_salt())
    assert other["cached_tokens"] == 0 and other["cache_write_tokens"] == 96
