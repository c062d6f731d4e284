"""Engines with KV tiers, closed (their disk tier released) at the end of each test.

`shared` makes engines on the real Redis at 127.0.0.1:6379. Each test's engines get model
fingerprints of their own (the real one plus a per-test suffix and a namespace, for tests
that need two models' worth of keys), so concurrent tests never see each other's blocks;
every key under the suffix is deleted afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import inference.engine
from inference.engine import Engine
from tests.inference.conftest import EngineFactory
from tests.inference.tiers.redis_helpers import REDIS_URL

TieredFactory = Callable[..., Engine]


@pytest.fixture
def tiered(make_engine: EngineFactory, tmp_path: Path) -> Iterator[TieredFactory]:
    """tiered(model_dir, device=N, host=N, disk=N, **settings): tier sizes in blocks; disk in tmp_path/kv."""
    engines: list[Engine] = []

    def make(
        model_dir: Path, *, device: int = 16, host: int = 0, disk: int = 0, disk_dir: Path | None = None, **kw: Any
    ) -> Engine:
        overrides: dict[str, Any] = {"kv_cache_blocks": device, "kv_host_blocks": host, **kw}
        if disk:
            overrides |= {"kv_disk_dir": disk_dir or tmp_path / "kv", "kv_disk_blocks": disk}
        engine = make_engine(model_dir, **overrides)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.ConnectionError:
        client.close()
        pytest.skip("Redis is not reachable at 127.0.0.1:6379")  # as tests/gateway/test_ratelimit.py does
    yield client
    client.close()


@pytest.fixture
def shared(
    make_engine: EngineFactory, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TieredFactory]:
    """shared(model_dir, namespace="a", device=N, host=N, url=REDIS_URL, **settings): an engine on the Redis tier."""
    suffix = f"t{uuid.uuid4().hex[:12]}"
    real = inference.engine.model_fingerprint
    current = {"namespace": "a"}
    monkeypatch.setattr(
        inference.engine, "model_fingerprint", lambda *a, **kw: f"{real(*a, **kw)}-{suffix}-{current['namespace']}"
    )
    engines: list[Engine] = []

    def make(
        model_dir: Path, *, namespace: str = "a", device: int = 16, host: int = 0, url: str = REDIS_URL, **kw: Any
    ) -> Engine:
        current["namespace"] = namespace
        # A generous timeout: on a loaded machine a slow reply must not turn into a miss the test did not expect.
        overrides: dict[str, Any] = {"kv_cache_blocks": device, "kv_host_blocks": host, "kv_redis_url": url}
        overrides |= {"kv_redis_timeout_ms": 10_000, **kw}
        engine = make_engine(model_dir, **overrides)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()
    keys = list(redis_client.scan_iter(match=f"kvg:v2:*-{suffix}-*", count=1000))
    if keys:
        redis_client.delete(*keys)
