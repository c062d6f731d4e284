"""What a cache explanation costs per request: gateway/cache_probe.py's lookup before and record after.

Every request pays this (the index must see every prompt to explain the next one), explained
or not. Measured on the event loop's code path, without the engine: hash the prompt's blocks,
look them up in the tenant's index and take the layout findings, then build the explanation and
record the request. Two workloads per prompt length:
- a repeated prompt (every block already in the index);
- a new prompt each time (after a shared system prompt of half the length: the index grows and
  evicts at its per-tenant bound).

    python -m bench.cache_explanation      # prints the table, writes its docs/benchmarks.md section
"""

from __future__ import annotations

import random
import statistics
import time
from types import SimpleNamespace
from typing import Any

from bench.report import machine_description, write_section
from gateway.cache_block_index import CacheBlockIndex
from gateway.cache_probe import EngineCacheFacts, probe_prompt
from gateway.generation import Prepared
from gateway.prompt import RenderedPrompt
from inference.clock import SystemClock
from inference.types import CacheRegion, SamplingParams, Usage

LENGTHS = (256, 1024, 4096)
ROUNDS = 300


def _gateway() -> Any:
    return SimpleNamespace(
        secret="bench-secret",
        cache_index=CacheBlockIndex(),
        cache_facts=EngineCacheFacts(block_size=16, clock=SystemClock(), lowest_tier="host"),
        settings=SimpleNamespace(min_cacheable_tokens=1024),
    )


def _prepared(tokens: list[int]) -> Prepared:
    prompt = RenderedPrompt(text="", token_ids=tokens)
    regions = (CacheRegion(end=len(tokens) - 1, ttl_s=300),)
    return Prepared("bench-model", prompt, SamplingParams(max_tokens=1), regions, None)


def _per_request_us(length: int, *, repeated: bool) -> float:
    gw = _gateway()
    rng = random.Random(length)
    shared = [rng.randrange(50_000) for _ in range(length // 2)]
    times: list[float] = []
    tail: list[int] = []
    for i in range(ROUNDS):
        if not repeated or i == 0:
            tail = [rng.randrange(50_000) for _ in range(length - len(shared))]
        prepared = _prepared(shared + tail)
        start = time.perf_counter()
        probe = probe_prompt(gw, tenant_id="ten_bench", prepared=prepared, fingerprint=None)
        read = length - 16 if repeated and i else len(shared)
        probe.finish(Usage(length, read // 16 * 16, 0, 1), ran=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[10:]) * 1e6


def main() -> None:
    rows = [(n, _per_request_us(n, repeated=True), _per_request_us(n, repeated=False)) for n in LENGTHS]
    lines = [
        f"Measured on {machine_description()}, one process, {ROUNDS} requests per cell (median).",
        "",
        "| prompt tokens | repeated prompt, µs/request | new prompt each time, µs/request |",
        "|---:|---:|---:|",
        *(f"| {n} | {rep:.0f} | {new:.0f} |" for n, rep, new in rows),
        "",
        "The issue's budget is 200 µs of gateway CPU per request. Within it here: "
        + (", ".join(f"{n} tokens" for n, rep, new in rows if max(rep, new) <= 200) or "none")
        + "; over it: "
        + (", ".join(f"{n} tokens" for n, rep, new in rows if max(rep, new) > 200) or "none")
        + ". The cost grows with the prompt's blocks (two XXH3 hashes and an index update per 16 tokens).",
        "Run `python -m bench.cache_explanation` to refresh this section.",
    ]
    print("\n".join(lines))
    write_section("cache-explanation", "Cache explanations: gateway CPU per request", lines)


if __name__ == "__main__":
    main()
