"""What publishing KV events costs the engine thread.

1. Per call: KVEventLog.stored / removed / flush, timed in a loop (what the pool and the tiers
   pay per block, and the engine per step).
2. End to end, at a 0% hit rate (every block is a new commit, so every step has events):
   the same engine with KV events on (published to the real NATS at KVGATE_BENCH_NATS_URL,
   default nats://127.0.0.1:4222) and off, runs interleaved to share the noise.

    PYTHONPATH=. python -m bench.kv_events [--quick] [--reps N]

The model is KVGATE_MODEL's (SmolLM2 by default); a tiny test model (tests/model_fixtures.py)
makes steps so short that the events' share is at its largest: an upper bound.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
import uuid

from inference.block_pool import BlockPool
from inference.engine import Engine
from inference.kv_event_log import KVEventLog
from inference.kv_event_publisher import attach_publisher
from inference.model_loader import load_model
from inference.settings import EngineSettings
from inference.types import CacheSpec, SamplingParams
from kvgate import kv_events

NATS_URL = os.environ.get("KVGATE_BENCH_NATS_URL", "nats://127.0.0.1:4222")


def per_call(n: int = 200_000) -> dict[str, float]:
    """Microseconds per stored (a chain), removed, and flush of a 16-event batch."""
    log = KVEventLog(engine_id="bench", block_size=16, sink=lambda batch: None)
    hashes = [random.randbytes(32) for _ in range(n)]
    start = time.perf_counter()
    parent = None
    for h in hashes:
        log.stored("CPU", h, parent, 300, 1e9)
        parent = h
    stored = time.perf_counter() - start
    start = time.perf_counter()
    for h in hashes:
        log.removed("CPU", h)
    removed = time.perf_counter() - start
    log.flush()
    start = time.perf_counter()
    for i in range(n // 16):
        for h in hashes[i * 16 : (i + 1) * 16]:
            log.stored("HOST", h, None, 300, 1e9)
        log.flush()
    stored_and_flushed = time.perf_counter() - start
    return {
        "stored_us": stored / n * 1e6,
        "removed_us": removed / n * 1e6,
        "stored_16_and_flush_us": stored_and_flushed / (n // 16) * 1e6,
    }


def pool_cycle(n: int = 100_000) -> dict[str, float]:
    """Microseconds per block through the device pool (allocate, which evicts; commit; release), events off vs on."""
    out = {}
    for name in ("off", "on"):
        pool = BlockPool(1024)
        if name == "on":
            pool.attach_events(KVEventLog(engine_id="bench", block_size=16, sink=lambda batch: None), "CPU")
        hashes = [random.randbytes(32) for _ in range(n)]
        tokens = tuple(range(16))
        start = time.perf_counter()
        for i, h in enumerate(hashes):
            (block,) = pool.allocate(1, 0.0)
            pool.commit(block, h, tokens, 300, 0.0, hashes[i - 1] if i else None)
            pool.release([block], 0.0)
            if pool.events is not None and i % 64 == 63:
                pool.events.flush()  # type: ignore[attr-defined]  # once per "step"
        out[name] = (time.perf_counter() - start) / n * 1e6
    return out


def run_batch(engine: Engine, prompts: list[list[int]], params: SamplingParams, salt: str) -> float:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{salt}-{i}", prompt, params, CacheSpec(salt=salt))
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def zero_hit(n: int, length: int, reps: int) -> dict[str, float]:
    """Tokens/s at 0% hits with KV events on (published to NATS) and off, and on/off."""
    loaded = load_model(EngineSettings())
    engine_id = f"bench-{uuid.uuid4().hex[:8]}"
    on = Engine(EngineSettings(kv_cache_gib=1.0, nats_url=NATS_URL, engine_id=engine_id), loaded=loaded)
    off = Engine(EngineSettings(kv_cache_gib=1.0), loaded=loaded)
    publisher = attach_publisher(on)
    assert publisher is not None and publisher.wait_connected(10), f"no NATS at {NATS_URL}"
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    rng = random.Random(5)
    run_batch(off, [[rng.randrange(100, 40000) for _ in range(64)]], params, "warmup")
    times: dict[str, list[float]] = {"on": [], "off": []}
    for rep in range(reps):
        for name, engine in (("on", on), ("off", off)) if rep % 2 == 0 else (("off", off), ("on", on)):
            prompts = [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]
            times[name].append(run_batch(engine, prompts, params, f"{name}{rep}"))
    assert on.kv_events is not None
    seq = on.kv_events.seq
    deadline = time.monotonic() + 10
    while publisher.published + publisher.dropped < seq and time.monotonic() < deadline:
        time.sleep(0.05)
    publisher.close()
    asyncio.run(_purge(kv_events.subject(on.model_id, engine_id)))
    best = {k: min(v) for k, v in times.items()}
    tokens = n * (length + 16)
    return {
        "on": tokens / best["on"],
        "off": tokens / best["off"],
        "ratio": best["off"] / best["on"],
        "batches": seq,
        "published": publisher.published,
        "dropped": publisher.dropped,
    }


async def _purge(subject: str) -> None:
    import nats

    nc = await nats.connect(NATS_URL)
    try:
        await nc.jetstream().purge_stream(kv_events.STREAM_NAME, subject=subject)
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-engine", action="store_true", help="only the per-call and pool timings")
    parser.add_argument("--reps", type=int, default=None, help="interleaved runs of each (default 4, quick 2)")
    args = parser.parse_args()
    calls = per_call(50_000 if args.quick else 200_000)
    print("per call (us):", {k: round(v, 2) for k, v in calls.items()})
    cycle = pool_cycle(20_000 if args.quick else 100_000)
    print(f"device pool, per block (allocate+commit+release, us): events off {cycle['off']:.2f}, on {cycle['on']:.2f}")
    if args.no_engine:
        return
    reps = args.reps or (2 if args.quick else 4)
    result = zero_hit(n=8 if args.quick else 16, length=256, reps=reps)
    print(
        f"0% hits, events on vs off: on {result['on']:.0f} tok/s, off {result['off']:.0f} tok/s, "
        f"on/off {result['ratio']:.3f} ({result['batches']} batches, {result['published']} published, "
        f"{result['dropped']} dropped)"
    )


if __name__ == "__main__":
    main()
