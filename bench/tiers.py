"""KV tier benchmark: TTFT of a 4k-token prefix hit on the device, in host memory and on disk, vs cold;
restore bandwidth per tier; decode throughput while offloading runs vs idle.

Run: .venv/bin/python bench/tiers.py [--reps 3] [--prefix 4096] [--disk-dir DIR] [--no-write]
Prints a table and rewrites the tiers section of docs/benchmarks.md. SmolLM2-135M-Instruct
in bf16 (on CPUs with avx512_bf16/AMX, else float32). Not a test: nothing here asserts.
Every scenario is measured side by side in one run and repeated; medians are reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import machine_description, write_section
from inference.engine import Engine
from inference.model_loader import LoadedModel, load_model
from inference.settings import EngineSettings
from inference.tiers import TierManager
from inference.types import CacheSpec, SamplingParams

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
_seeds = iter(range(1, 1_000_000))


def tokens(n: int) -> list[int]:
    rng = random.Random(next(_seeds))
    return [rng.randrange(100, 40000) for _ in range(n)]


def engine_on(loaded: LoadedModel, **overrides: object) -> Engine:
    return Engine(EngineSettings(**{"kv_offload_staging_mib": 128.0, **overrides}), loaded=loaded)


def evict_device(engine: Engine) -> None:
    """Evict every cached device block, as a burst of new requests would: take all free blocks, give them back."""
    now = engine.clock.now()
    engine.pool.release(engine.pool.allocate(engine.pool.num_free, now), now)


def drop_page_cache(engine: Engine) -> None:
    """Make the next disk reads come from the device, not the page cache (only this tier's files)."""
    disk = engine.tiers.tier("disk")
    for fd in disk._fds.values():
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


class LoadTimer:
    """Wraps TierManager.load to time each restore: (seconds, bytes) of the last one."""

    def __init__(self, tiers: TierManager) -> None:
        self.last = (0.0, 0)
        inner = tiers.load

        def load(hits, block_ids) -> bool:
            start = time.perf_counter()
            ok = inner(hits, block_ids)
            self.last = (time.perf_counter() - start, len(hits) * tiers.layout.nbytes)
            return ok

        tiers.load = load  # type: ignore[method-assign]


def ttft(engine: Engine, prompt: list[int], tier: str) -> tuple[float, int]:
    """TTFT of the prompt, and the tokens it read, all of them from `tier` (asserted)."""
    out = engine.generate(prompt, ONE_TOKEN)
    usage = out.usage
    assert usage.cached_tokens == usage.cached_tokens_by_tier.get(tier, 0), usage
    return out.ttft_s or 0.0, usage.cached_tokens


def bench_ttft(loaded: LoadedModel, prefix: int, reps: int, disk_dir: Path) -> dict:
    """TTFT of a prefix-length prompt: cold, then again from each tier; restore GB/s per tier."""
    blocks = prefix // 16 + 2
    host_engine = engine_on(loaded, kv_cache_blocks=blocks + 8, kv_host_blocks=blocks + 8)
    disk_engine = engine_on(
        loaded, kv_cache_blocks=blocks + 8, kv_disk_dir=disk_dir, kv_disk_blocks=4 * blocks, kv_host_blocks=0
    )
    timers = {"host": LoadTimer(host_engine.tiers), "disk": LoadTimer(disk_engine.tiers)}
    for engine in (host_engine, disk_engine):
        engine.generate(tokens(64), ONE_TOKEN)  # warm up allocator and kernels
    rows = ("cold", "device", "host", "disk", "disk_again")
    times: dict[str, list[float]] = {k: [] for k in rows}
    restore: dict[str, list[float]] = {k: [] for k in rows[2:]}
    evict_ms: dict[str, list[float]] = {"host": [], "disk": []}
    cached: dict[str, int] = {}

    def measure(row: str, engine: Engine, prompt: list[int], tier: str) -> None:
        t, cached[row] = ttft(engine, prompt, tier)
        times[row].append(t)
        if row in restore:
            seconds, nbytes = timers[tier].last
            restore[row].append(nbytes / seconds / 1e9)

    for _ in range(reps):
        prompt = tokens(prefix)
        measure("cold", host_engine, prompt, "device")
        measure("device", host_engine, prompt, "device")
        evict_ms["host"].append(1000 * timed(lambda: evict_device(host_engine)))
        measure("host", host_engine, prompt, "host")

        prompt = tokens(prefix)
        ttft(disk_engine, prompt, "device")
        evict_ms["disk"].append(1000 * timed(lambda: evict_device(disk_engine)))
        disk_engine.tiers.flush()
        drop_page_cache(disk_engine)
        measure("disk", disk_engine, prompt, "disk")
        evict_device(disk_engine)  # on disk already: nothing is written again
        measure("disk_again", disk_engine, prompt, "disk")
    disk_engine.close()
    host_engine.close()
    return {
        "ttft": {k: statistics.median(v) for k, v in times.items()},
        "restore_gbps": {k: statistics.median(v) for k, v in restore.items()},
        "cached": cached,
        "evict_ms": {k: statistics.median(v) for k, v in evict_ms.items()},
        "prefix_mb": cached["host"] // 16 * host_engine.tiers.layout.nbytes / 1e6,
    }


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def decode_steps(
    engine: Engine, streams: int, new_tokens: int, between: Callable[[int], None] | None = None
) -> list[tuple[float, int, bool]]:
    """Run `streams` concurrent decodes; (seconds, tokens, offload worker busy) of every pure decode step.

    between(i), if given, runs before decode step i, outside the timed step.
    """
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    for i in range(streams):
        engine.add_request(f"d{time.monotonic_ns()}-{i}", tokens(64), params, CacheSpec(salt="decode"))
    first = 0
    while first < streams:  # the prefills (a prompt's tail after its last full block is a pass of its own)
        first += len(engine.step())
    tiers = engine.tiers
    steps = []
    while engine.has_unfinished():
        if between is not None:
            between(len(steps))
        busy = tiers is not None and tiers.num_pending_stores > 0
        start = time.perf_counter()
        produced = len(engine.step())
        steps.append((time.perf_counter() - start, produced, busy))
    return steps


def rate(steps: list[tuple[float, int, bool]]) -> float:
    return sum(n for _, n, _ in steps) / sum(s for s, _, _ in steps)


def fill_with_cached(engine: Engine) -> None:
    """Turn every empty device block into a cached one (synthetic content), so that new blocks must evict."""
    pool, now = engine.pool, engine.clock.now()
    blocks = pool.allocate(len(pool.empty), now)
    for block in blocks:
        assert pool.commit(block, random.randbytes(32), tuple(range(engine.block_size)), 300, now)
    pool.release(blocks, now)


class WriteTimer:
    """Wraps DiskTier.write to time the offload worker's writes (checksum + pwrite into the page cache)."""

    def __init__(self, engine: Engine) -> None:
        disk = engine.tiers.tier("disk")
        self.seconds, inner = 0.0, disk.write

        def write(entry, data) -> None:
            start = time.perf_counter()
            inner(entry, data)
            self.seconds += time.perf_counter() - start

        disk.write = write  # type: ignore[method-assign]


def bench_decode(loaded: LoadedModel, streams: int, new_tokens: int, reps: int, disk_dir: Path) -> dict:
    """Decode tokens/s with no tiers, with tiers idle, and while offloading: every 16 decode steps a burst
    evicts every cached block of the device pool (down through a small host tier to the disk queue) and
    refills the pool with cached blocks, so the worker writes while decode steps run, and every new decode
    block evicts one more block."""
    pool = 2 * 4096 // 16 + streams * (64 + new_tokens) // 16 + 8
    plain = engine_on(loaded, kv_cache_blocks=pool)
    tiered = engine_on(
        loaded,
        kv_cache_blocks=pool,
        kv_host_blocks=32,
        kv_disk_dir=disk_dir,
        kv_disk_blocks=8192,
        kv_offload_staging_mib=256.0,
    )
    tiers = tiered.tiers
    writes = WriteTimer(tiered)
    runs: dict[str, list[float]] = {
        "no tiers": [],
        "tiers idle": [],
        "offloading: each new block evicts one": [],
        "offloading: bursts (whole run)": [],
    }
    busy_steps: list[tuple[float, int, bool]] = []
    idle_steps: list[tuple[float, int, bool]] = []
    bursts: list[tuple[float, int]] = []

    def burst(step: int) -> None:
        if step % 16 == 0:
            evicted = tiered.pool.num_evictions
            seconds = timed(lambda: (evict_device(tiered), fill_with_cached(tiered)))
            bursts.append((seconds, tiered.pool.num_evictions - evicted))

    for engine in (plain, tiered):
        decode_steps(engine, streams, 8)  # warm up
    for _ in range(reps):
        runs["no tiers"].append(rate(decode_steps(plain, streams, new_tokens)))
        evict_device(tiered)
        tiers.flush()
        runs["tiers idle"].append(rate(decode_steps(tiered, streams, new_tokens)))
        fill_with_cached(tiered)
        runs["offloading: each new block evicts one"].append(rate(decode_steps(tiered, streams, new_tokens)))
        tiers.flush()
        steps = decode_steps(tiered, streams, new_tokens, between=burst)
        runs["offloading: bursts (whole run)"].append(rate(steps))
        busy_steps += [s for s in steps if s[2]]
        idle_steps += [s for s in steps if not s[2]]
        tiers.flush()
    tiered.close()
    disk = tiers.tier("disk").stats
    return {
        "rates": {k: statistics.median(v) for k, v in runs.items()},
        "busy": rate(busy_steps) if busy_steps else float("nan"),
        "busy_steps": len(busy_steps),
        "all_steps": len(busy_steps) + len(idle_steps),
        "idle": rate(idle_steps),
        "burst_ms": 1000 * statistics.median(s for s, _ in bursts),
        "burst_blocks": statistics.median(n for _, n in bursts),
        "write_gbps": disk.bytes_written / writes.seconds / 1e9,
        "written_mb": disk.bytes_written / 1e6,
        "block_mb": tiers.layout.nbytes / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prefix", type=int, default=4096, help="prefix length in tokens")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--disk-dir", type=Path, default=None, help="disk tier directory (default: a temp dir)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()

    loaded = load_model(EngineSettings())
    load = os.getloadavg()
    print(f"model {loaded.model_id} {loaded.dtype} on {machine_description()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-", dir=args.disk_dir) as tmp:
        t = bench_ttft(loaded, args.prefix, args.reps, Path(tmp) / "ttft")
        d = bench_decode(loaded, args.streams, args.new_tokens, args.reps, Path(tmp) / "decode")
    lines = report(t, d, args, loaded, (load[0], os.getloadavg()[0]))
    print("\n".join(lines))
    if not args.no_write:
        write_section("tiers", "KV tiers (bench/tiers.py)", lines)


def report(t: dict, d: dict, args: argparse.Namespace, loaded: LoadedModel, load: tuple[float, ...]) -> list[str]:
    ttft, cold = t["ttft"], t["ttft"]["cold"]
    gbps = t["restore_gbps"]
    rows = [
        ("cold (recompute)", ttft["cold"], 0, "-"),
        ("device hit", ttft["device"], t["cached"]["device"], "-"),
        ("host hit", ttft["host"], t["cached"]["host"], f"{gbps['host']:.1f}"),
        ("disk hit, first read (from the disk)", ttft["disk"], t["cached"]["disk"], f"{gbps['disk']:.1f}"),
        (
            "disk hit, read again (page cache)",
            ttft["disk_again"],
            t["cached"]["disk_again"],
            f"{gbps['disk_again']:.1f}",
        ),
    ]
    rates = d["rates"]
    base = rates["no tiers"]
    lines = [
        f"Machine: {machine_description()}; Python {platform.python_version()}, torch {torch.__version__}; "
        f"{loaded.model_id} in {loaded.dtype}, {torch.get_num_threads()} threads. Load average "
        f"{load[0]:.2f} at the start, {load[1]:.2f} at the end (the cores are shared with other work, so "
        "timings vary from run to run). "
        f"Medians of {args.reps} runs.",
        "",
        f"TTFT of a {args.prefix}-token prompt whose prefix ({t['prefix_mb']:.0f} MB of KV) is cached in each tier:",
        "",
        "| where the prefix is | TTFT | vs cold | tokens read | restore GB/s |",
        "|---|---|---|---|---|",
        *(f"| {name} | {s:.3f} s | {cold / s:.1f}× | {n} | {bw} |" for name, s, n, bw in rows),
        "",
        "Restore GB/s: bytes promoted into the device pool over the time of the copy (host), or of read + "
        "checksum + copy (disk). Blocks reach the disk with O_DIRECT writes, so a first read comes from the "
        "disk itself (the tier's files are also fsynced and dropped from the page cache first); reads are "
        "buffered, so a block read again comes from the page cache. Evicting the "
        f"{t['prefix_mb']:.0f} MB prefix from the device (the synchronous copies on the engine thread) took "
        f"{t['evict_ms']['host']:.0f} ms into host memory and {t['evict_ms']['disk']:.0f} ms into the "
        "staging buffers of the disk queue.",
        "",
        f"Decode, {args.streams} concurrent streams of {args.new_tokens} tokens:",
        "",
        "| condition | tokens/s | vs no tiers |",
        "|---|---|---|",
        *(f"| {name} | {r:.1f} | {r / base:.3f} |" for name, r in rates.items()),
        f"| bursts: the {d['busy_steps']} of {d['all_steps']} steps that ran while the worker was writing "
        f"| {d['busy']:.1f} | {d['busy'] / base:.3f} |",
        f"| bursts: the other steps of the same runs | {d['idle']:.1f} | {d['idle'] / base:.3f} |",
        "",
        '"Each new block evicts one": the device pool is full of cached blocks, so every block a decode '
        "stream starts evicts a cached one, through a 32-block host tier to disk (the steady state of a busy "
        'server). "Bursts", a stress case: every 16 decode steps, every cached block of the pool is evicted '
        f"({d['burst_blocks']:.0f} blocks, {d['burst_blocks'] * d['block_mb']:.0f} MB) into the disk queue and "
        f"the pool refilled with cached blocks. The worker wrote {d['written_mb']:.0f} MB in all, at "
        f"{d['write_gbps']:.2f} GB/s (xxh3 + O_DIRECT pwrite). Each burst's copies on the engine "
        f"thread took {d['burst_ms']:.0f} ms; they ran between steps and are not in the rates (in serving "
        "they happen inside the step whose allocation evicts, as the eviction times above show).",
    ]
    return lines


if __name__ == "__main__":
    main()
