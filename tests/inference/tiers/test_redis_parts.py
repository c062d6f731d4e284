"""The Redis tier's parts: its circuit breaker, the model fingerprint, its writer's bounded queue, metrics, settings."""

from __future__ import annotations

import random
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
import torch
from pydantic import ValidationError

from inference.model_fingerprint import model_fingerprint
from inference.settings import EngineSettings
from inference.tiers import TIER_NAMES
from inference.tiers.circuit_breaker import CircuitBreaker
from inference.types import CacheSpec, SamplingParams
from tests.inference.helpers import by_tier, checked, random_prompt
from tests.inference.tiers.redis_helpers import closed_port, redis_tier
from tests.inference.tiers.test_tier_metrics import scrape

GREEDY_8 = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


class FakeMonotonic:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_breaker_opens_on_a_failure_probes_after_its_backoff_and_doubles_it():
    clock = FakeMonotonic()
    breaker = CircuitBreaker(base_backoff_s=1.0, max_backoff_s=4.0, monotonic=clock)
    assert breaker.allow() and not breaker.is_open  # closed: every call goes through
    breaker.failure()
    assert breaker.is_open and not breaker.allow() and breaker.num_opened == 1
    clock.t += 1.0
    assert breaker.allow()  # the one probe
    assert not breaker.allow()  # others wait for its answer
    breaker.failure()  # the probe failed: twice as long
    clock.t += 1.5
    assert not breaker.allow()
    clock.t += 0.5
    assert breaker.allow()
    breaker.failure()
    clock.t += 4.0  # capped at max_backoff_s
    assert breaker.allow()
    breaker.success()
    assert not breaker.is_open and breaker.allow() and breaker.allow() and breaker.num_opened == 1


def test_the_fingerprint_is_stable_for_a_model_and_differs_by_weights_dtype_and_numerics(
    tiny_llama_dir, tiny_qwen2_dir
):
    cpu = torch.device("cpu")

    def fp(path, dtype=torch.float32, compute="attn=cpu_kernel,fused=2"):
        return model_fingerprint(path, dtype=dtype, device=cpu, compute=compute)

    assert fp(tiny_llama_dir) == fp(tiny_llama_dir)
    others = {fp(tiny_qwen2_dir), fp(tiny_llama_dir, torch.bfloat16), fp(tiny_llama_dir, compute="attn=torch,fused=0")}
    assert fp(tiny_llama_dir) not in others and len(others) == 3


def test_the_fingerprint_covers_the_weight_bytes(tiny_llama_dir, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in tiny_llama_dir.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    args = {"dtype": torch.float32, "device": torch.device("cpu"), "compute": ""}
    assert model_fingerprint(copy, **args) == model_fingerprint(tiny_llama_dir, **args)  # the path is not in it
    weights = next(copy.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-3] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    assert model_fingerprint(copy, **args) != model_fingerprint(tiny_llama_dir, **args)


def test_a_full_write_queue_drops_stores_and_never_holds_up_the_engine(shared, tiny_llama_dir):
    engine = shared(tiny_llama_dir, kv_redis_queue_mib=0.001)  # room for one block
    tier = redis_tier(engine)
    gate, send = threading.Event(), tier.writer._send
    tier.writer._send = lambda jobs: (gate.wait(timeout=60), send(jobs))
    prompt, spec = random_prompt(random.Random(87), 150), CacheSpec(salt=f"t-{uuid.uuid4().hex}")
    try:
        out = checked(engine.generate(prompt, GREEDY_8, spec))  # 9 blocks for a writer stuck on its first
    finally:
        gate.set()
    engine.tiers.flush()
    assert out.usage.cache_write_tokens == 144
    assert tier.stats.dropped_stores >= 7 and tier.stats.stores == 9 - tier.stats.dropped_stores
    # Paired positive: an engine whose writer keeps up shares every block.
    free = shared(tiny_llama_dir)
    checked(free.generate(prompt, GREEDY_8, CacheSpec(salt=f"t-{uuid.uuid4().hex}")))
    free.tiers.flush()
    assert redis_tier(free).stats.stores == 9 and redis_tier(free).stats.dropped_stores == 0


def test_metrics_label_the_redis_tier(shared, tiny_llama_dir):
    a, b = shared(tiny_llama_dir), shared(tiny_llama_dir)
    down = shared(tiny_llama_dir, url=f"redis://127.0.0.1:{closed_port()}/0")
    prompt, spec = random_prompt(random.Random(89), 150), CacheSpec(salt=f"t-{uuid.uuid4().hex}")
    checked(a.generate(prompt, GREEDY_8, spec))
    a.tiers.flush()
    assert checked(b.generate(prompt, GREEDY_8, spec)).usage.cached_tokens_by_tier == by_tier(redis=144)
    checked(down.generate(prompt, GREEDY_8, spec))
    m = scrape(b)
    assert m["kvgate:kv_tier_hit_tokens_total{tier=redis}"] == 144
    assert m["kvgate:kv_tier_loads_total{tier=redis}"] == 9
    assert m["kvgate:kv_tier_bytes_read_total{tier=redis}"] == 9 * redis_tier(b).layout.nbytes
    assert m["kvgate:kv_tier_errors_total{tier=redis}"] == 0
    m_down = scrape(down)
    assert m_down["kvgate:kv_tier_errors_total{tier=redis}"] >= 1
    assert m_down["kvgate:kv_tier_hit_tokens_total{tier=redis}"] == 0


def test_the_redis_tier_is_named_after_host_and_disk_and_off_unless_its_url_is_set(monkeypatch):
    assert TIER_NAMES == ("device", "host", "disk", "redis")
    monkeypatch.delenv("KVGATE_KV_REDIS_URL", raising=False)
    assert EngineSettings().kv_redis_url is None
    monkeypatch.setenv("KVGATE_KV_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert EngineSettings().kv_redis_url == "redis://127.0.0.1:6379/0"
    monkeypatch.setenv("KVGATE_KV_REDIS_URL", "127.0.0.1:6379")
    with pytest.raises(ValidationError, match="must start with redis://"):
        EngineSettings()


@pytest.mark.parametrize("url", [None, ""])
def test_no_url_means_no_redis_tier(tiered, tiny_llama_dir, url):
    engine = tiered(tiny_llama_dir, host=8, kv_redis_url=url)
    assert engine.tiers is not None and engine.tiers.tier("redis") is None and engine.tiers.shared == []


@pytest.fixture
def private_redis_port() -> Iterator[tuple[int, Callable[[], None], Callable[[], None]]]:
    """A loopback port for a redis-server of this test's own, with start() and stop() (stop waits for its exit)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = closed_port()
    procs: list[subprocess.Popen] = []

    def start() -> None:
        args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        client = redis.Redis(port=port, socket_connect_timeout=1)
        deadline = time.monotonic() + 30
        while True:  # wait for it to listen: poll its PING, bounded
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def stop() -> None:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        procs.clear()

    yield port, start, stop
    stop()


def test_sharing_resumes_when_redis_comes_back_and_stops_cleanly_when_it_goes(
    shared, tiny_llama_dir, private_redis_port
):
    port, start, stop = private_redis_port
    clock = FakeMonotonic()
    a = shared(tiny_llama_dir, url=f"redis://127.0.0.1:{port}/0")
    tier = redis_tier(a)
    tier.breaker = CircuitBreaker(base_backoff_s=1.0, monotonic=clock)
    rng, spec = random.Random(91), CacheSpec(salt=f"t-{uuid.uuid4().hex}")
    first, second, third = random_prompt(rng, 150), random_prompt(rng, 150), random_prompt(rng, 150)
    checked(a.generate(first, GREEDY_8, spec))  # nothing listens yet
    a.tiers.flush()
    assert tier.stats.stores == 0 and tier.stats.errors >= 1 and tier.breaker.is_open

    start()
    checked(a.generate(second, GREEDY_8, spec))  # within the backoff: skipped, not tried
    a.tiers.flush()
    assert tier.stats.stores == 0 and tier.stats.skipped >= 1
    clock.t += 1.0  # the backoff is over: the next call probes, succeeds, and closes the breaker
    checked(a.generate(third, GREEDY_8, spec))
    a.tiers.flush()
    # Its 9 blocks, and some from the outage, stored as the device evicted them.
    assert not tier.breaker.is_open and tier.stats.stores >= 9
    b = shared(tiny_llama_dir, url=f"redis://127.0.0.1:{port}/0")
    assert checked(b.generate(third, GREEDY_8, spec)).usage.cached_tokens_by_tier == by_tier(redis=144)

    stop()  # Redis goes away mid-run: B carries on, recomputing
    errors = redis_tier(b).stats.errors
    out = checked(b.generate(first, GREEDY_8, spec))
    assert out.usage.cached_tokens == 0 and out.usage.cache_write_tokens == 144
    assert redis_tier(b).stats.errors > errors
