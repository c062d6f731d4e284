"""Redis KV tier benchmark: what sharing a prefix through Redis costs, against recomputing it.

Part 1 (the tier alone, SmolLM2-sized blocks, no model): the engine thread's cost of
store() (copy and enqueue), the writer's time to get the blocks into Redis, and the
lookups and loads of a whole prefix by chunk size.
Part 2 (SmolLM2-135M-Instruct, two engines): TTFT of a prefix computed cold by engine A,
read from Redis by engine B, and read from B's device.

Run: .venv/bin/python bench/redis_tier.py [--url redis://127.0.0.1:6379/0] [--prefix 1024] [--reps 3] [--no-write]
Keys go under a fingerprint of their own and are deleted afterwards. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import inference.engine
from bench.report import machine_description, write_section
from inference.clock import SystemClock
from inference.engine import Engine
from inference.model_loader import load_model
from inference.settings import EngineSettings
from inference.tiers.layout import BlockLayout
from inference.tiers.lru_index import TierEntry
from inference.tiers.redis_tier import RedisTier, connect
from inference.types import CacheSpec, SamplingParams

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def tier_costs(url: str, dtype: torch.dtype, blocks: int, chunks: list[int], reps: int) -> list[str]:
    layout = BlockLayout((30, 2, 16, 3, 64), dtype)  # SmolLM2-135M's block
    source = torch.randn((blocks, *layout.shape)).to(dtype)
    rows = []
    for chunk in chunks:
        store_s, write_s, lookup_s, load_s = [], [], [], []
        for _ in range(reps):
            fingerprint = f"bench-{uuid.uuid4().hex}"
            clock = SystemClock()
            tier = RedisTier(
                connect(url, 2.0),
                layout,
                model_fingerprint=fingerprint,
                clock=clock,
                capacity=blocks,
                chunk_blocks=chunk,
                queue_blocks=blocks,
                timeout_s=2.0,
            )
            now = clock.now()
            entries = [TierEntry(random.randbytes(32), tuple(range(16)), 300, now + 300, now) for _ in range(blocks)]
            t0 = time.perf_counter()
            for i, entry in enumerate(entries):
                assert tier.store(entry, source[i], now=now, demote=None)
            t1 = time.perf_counter()
            tier.flush()
            t2 = time.perf_counter()
            keys = [(e.block_hash, e.token_ids) for e in entries]
            found: list[TierEntry | None] = []
            while len(found) < blocks:
                found += tier.lookup_many(keys[len(found) :], clock.now())
            t3 = time.perf_counter()
            assert all(e is not None for e in found) and tier.stats.stores == blocks
            dest = torch.empty_like(source)
            tier.prepare_load(found)  # type: ignore[arg-type]
            assert all(tier.load(e, dest[i]) for i, e in enumerate(found))  # type: ignore[arg-type]
            tier.complete_load(found)  # type: ignore[arg-type]
            t4 = time.perf_counter()
            assert torch.equal(dest, source)
            store_s.append(t1 - t0)
            write_s.append(t2 - t1)
            lookup_s.append(t3 - t2)
            load_s.append(t4 - t3)
            tier.close()
            client = redis.Redis.from_url(url)
            client.delete(*[tier.key(e.block_hash) for e in entries])
            client.close()
        mb = blocks * layout.nbytes / 1e6
        med = statistics.median
        rows.append(
            f"| {chunk} | {med(store_s) * 1e3:.1f} | {med(write_s) * 1e3:.0f} ({mb / med(write_s):.0f} MB/s) "
            f"| {med(lookup_s) * 1e3:.1f} | {med(load_s) * 1e3:.0f} ({mb / med(load_s):.0f} MB/s) |"
        )
    return rows


def ttft(engine: Engine, prompt: list[int], spec: CacheSpec) -> tuple[float, dict[str, int]]:
    t0 = time.perf_counter()
    out = engine.generate(prompt, ONE_TOKEN, spec)
    return time.perf_counter() - t0, dict(out.usage.cached_tokens_by_tier)


def end_to_end(url: str, prefix: int, reps: int) -> tuple[list[str], str]:
    settings = EngineSettings(kv_redis_url=url, kv_cache_gib=0.5)
    loaded = load_model(settings)
    suffix = uuid.uuid4().hex
    real = inference.engine.model_fingerprint
    inference.engine.model_fingerprint = lambda *a, **kw: f"{real(*a, **kw)}-bench{suffix}"
    a, b = Engine(settings, loaded=loaded), Engine(settings, loaded=loaded)
    cold, remote, device = [], [], []
    try:
        for _ in range(reps):
            rng = random.Random()
            prompt, spec = [rng.randrange(100, 40000) for _ in range(prefix + 1)], CacheSpec(salt=uuid.uuid4().hex)
            cold.append(ttft(a, prompt, spec)[0])
            a.tiers.flush()
            seconds, by_tier = ttft(b, prompt, spec)
            assert by_tier["redis"] == prefix, by_tier
            remote.append(seconds)
            seconds, by_tier = ttft(b, prompt, spec)
            assert by_tier["device"] == prefix, by_tier
            device.append(seconds)
    finally:
        a.close()
        b.close()
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(match=f"kvg:v2:*-bench{suffix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    med = statistics.median
    rows = [
        f"| cold (engine A computes it) | {med(cold) * 1e3:.0f} |",
        f"| from Redis (engine B, empty device) | {med(remote) * 1e3:.0f} |",
        f"| from B's device | {med(device) * 1e3:.0f} |",
    ]
    return rows, str(loaded.dtype)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--prefix", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    e2e, dtype_name = end_to_end(args.url, args.prefix, args.reps)
    dtype = getattr(torch, dtype_name.removeprefix("torch."))
    blocks = args.prefix // 16
    tier_rows = tier_costs(args.url, dtype, blocks, [8, 32, 128], args.reps)
    nbytes = BlockLayout((30, 2, 16, 3, 64), dtype).nbytes
    lines = [
        f"Machine: {machine_description()}; Python {platform.python_version()}, torch {torch.__version__}; "
        f"SmolLM2-135M-Instruct in {dtype_name}; Redis on loopback. Medians of {args.reps}; load average at the "
        f"end {os.getloadavg()[0]:.1f} (other work on the machine inflates every row alike).",
        "",
        f"TTFT of a {args.prefix}-token prefix (+1 token), ms:",
        "",
        "| where the prefix comes from | TTFT ms |",
        "|---|---|",
        *e2e,
        "",
        f"The tier alone: {blocks} blocks of {nbytes:,} bytes ({blocks * nbytes / 1e6:.0f} MB), by chunk size "
        "(blocks per round trip). store() is the engine thread's cost (copy and enqueue); the writer then "
        "sends them; lookups read headers and PTTLs; loads GETEX, verify and copy into place.",
        "",
        "| chunk | store() ms (engine thread) | writer ms | lookups ms | loads ms |",
        "|---|---|---|---|---|",
        *tier_rows,
    ]
    print("\n".join(lines))
    if not args.no_write:
        write_section("redis_tier", "Shared KV tier in Redis (bench/redis_tier.py)", lines)


if __name__ == "__main__":
    main()
