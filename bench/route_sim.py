"""Routing simulator: kvgate's real router and block index against 8-64 simulated engines.

Run: .venv/bin/python bench/route_sim.py [--engines 16] [--quick] [--write-docs]
     .venv/bin/python bench/route_sim.py --tune        # grid search of the router's weights
     .venv/bin/python bench/route_sim.py --calibrate   # time the real engine, rewrite the calibration file

Each simulated engine (bench/route_sim_engines.py) has an LRU device tier and a host tier
with TTLs, a prefill cost a + b·uncached tokens (+ cached-context and host-copy terms) and
a decode cost, calibrated from the real SmolLM2 engine on this machine
(bench/route_sim_calibration.json). Engines publish KV events, fed in process to the real
gateway.routing BlockIndex, so the event-fed CacheAwareRouter sees what it would see over
NATS. Workloads (bench/route_sim_workloads.py) carry real salted chained block hashes.

Metrics, per policy and workload:
- hit rate: prompt tokens read from a cache (device or host tier) / all prompt tokens;
- TTFT p50/p99: queue wait + prefill, in simulated seconds;
- imbalance p99: every simulated second, max over engines of active requests (queued +
  prefilling + decoding) / the mean over engines, sampled when that mean is at least 1
  (at least as many requests in flight as engines, so each could have work); the 99th
  percentile of those samples. 1.0 is perfect balance.
Not a test: nothing here asserts; tests/bench/test_route_sim.py checks the ordering.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench.route_sim_engines import CALIBRATION, CostModel, Job, SimEngine, TierSizes
from bench.route_sim_policies import POLICIES
from bench.route_sim_workloads import BLOCK_SIZE, WORKLOADS, SimRequest, generate, scaled
from gateway.routing.cache_aware import RouteWeights
from gateway.routing.types import EngineLoad
from kvgate.kv_events import KVEventBatch

WEIGHTS_FILE = Path(__file__).resolve().parent / "route_sim_weights.json"
T0 = 2_000_000_000.0  # simulated epoch seconds: expires_at values look like the real ones
_EVENTS, _PREFILLED, _DECODED, _ARRIVE, _SAMPLE, _SWEEP = range(6)


@dataclass(frozen=True)
class RunResult:
    policy: str
    workload: str
    engines: int
    requests: int
    hit_rate: float
    device_share: float  # of the tokens read, the part read from the device tier
    ttft_p50: float
    ttft_p99: float
    imbalance_p99: float
    predicted_over_actual: float  # router's predicted hit blocks / the engines' actual, summed


def simulate(
    requests: list[SimRequest],
    policy: str,
    *,
    engines: int,
    cost: CostModel,
    sizes: TierSizes,
    weights: RouteWeights,
    event_delay_s: float = 0.0,
    workload: str = "",
) -> RunResult:
    router, sink = POLICIES[policy](weights, sizes.device_blocks)
    heap: list[tuple] = []
    order = itertools.count()

    def push(at: float, kind: int, payload: object = None) -> None:
        heapq.heappush(heap, (at, kind, next(order), payload))

    def publish(batch: KVEventBatch) -> None:
        if sink is None:
            return
        if event_delay_s <= 0:
            sink(batch, batch.ts)
        else:
            push(batch.ts + event_delay_s, _EVENTS, batch)

    sims = {f"engine-{i:02d}": SimEngine(f"engine-{i:02d}", sizes, cost, publish) for i in range(engines)}
    for r in requests:
        push(T0 + r.arrival, _ARRIVE, r)
    end = T0 + (requests[-1].arrival if requests else 0.0)
    push(T0, _SAMPLE)
    push(T0 + 10.0, _SWEEP)
    jobs: list[Job] = []
    samples: list[float] = []
    predicted = actual = 0
    ttl = int(sizes.ttl_s)

    def start(engine: SimEngine, now: float) -> None:
        done_at = engine.start_next(now)
        if done_at is not None:
            push(done_at, _PREFILLED, engine)

    while heap:
        now, kind, _, payload = heapq.heappop(heap)
        if kind == _ARRIVE:
            req: SimRequest = payload
            loads = {e: EngineLoad(s.active, s.queued_prefill_tokens) for e, s in sims.items()}
            decision = router.choose(req.block_hashes, loads, ttl_s=ttl, now=now)
            engine = sims[decision.engine]
            limit = (req.prompt_tokens - 1) // BLOCK_SIZE
            dev, host = engine.cached_prefix(req.block_hashes, now, limit)
            job = Job(req, decision, now, req.prompt_tokens - (dev + host) * BLOCK_SIZE)
            engine.enqueue(job)
            start(engine, now)
        elif kind == _PREFILLED:
            engine = payload
            job = engine.finish_prefill(now)
            jobs.append(job)
            hits = job.device_hits + job.host_hits
            router.record_actual(job.decision, hits)
            predicted += job.decision.predicted_hit_blocks
            actual += hits
            push(now + engine.decode_s(job), _DECODED, engine)
            start(engine, now)
        elif kind == _DECODED:
            payload.finish_decode()
        elif kind == _EVENTS:
            sink(payload, now)
        elif kind == _SAMPLE:
            active = [s.active for s in sims.values()]
            mean = sum(active) / len(active)
            if mean >= 1:  # busy enough that every engine could have work: balance matters
                samples.append(max(active) / mean)
            if now < end or any(active):
                push(now + 1.0, _SAMPLE)
        elif kind == _SWEEP:
            for s in sims.values():
                s.sweep(now)
            if now < end:
                push(now + 10.0, _SWEEP)

    prompt = sum(j.request.prompt_tokens for j in jobs)
    read = sum(j.device_hits + j.host_hits for j in jobs) * BLOCK_SIZE
    ttfts = np.array([j.ttft for j in jobs])
    return RunResult(
        policy=policy,
        workload=workload,
        engines=engines,
        requests=len(jobs),
        hit_rate=read / prompt if prompt else 0.0,
        device_share=sum(j.device_hits for j in jobs) * BLOCK_SIZE / read if read else 0.0,
        ttft_p50=float(np.percentile(ttfts, 50)) if len(jobs) else 0.0,
        ttft_p99=float(np.percentile(ttfts, 99)) if len(jobs) else 0.0,
        imbalance_p99=float(np.percentile(samples, 99)) if samples else 1.0,
        predicted_over_actual=predicted / actual if actual else 0.0,
    )


def load_weights() -> RouteWeights:
    if WEIGHTS_FILE.exists():
        return RouteWeights(**json.loads(WEIGHTS_FILE.read_text())["weights"])
    return RouteWeights()


def load_cost() -> CostModel:
    if CALIBRATION.exists():
        return CostModel.load()
    return CostModel(a=0.03, b=0.0010, c=0.000004, h=0.000005, d=0.04)


def run_table(
    workloads: list[str],
    policies: list[str],
    engines: int,
    factor: float,
    seed: int,
    weights: RouteWeights,
    cost: CostModel,
    sizes: TierSizes,
) -> list[RunResult]:
    results = []
    for name in workloads:
        requests = generate(scaled(WORKLOADS[name], factor), engines, seed, lambda n: cost.prefill_s(n, 0, 0))
        for policy in policies:
            results.append(
                simulate(requests, policy, engines=engines, cost=cost, sizes=sizes, weights=weights, workload=name)
            )
    return results


def table(results: list[RunResult], *, by_engines: bool = False) -> list[str]:
    first = "engines" if by_engines else "workload"
    lines = [
        f"| {first} | policy | requests | hit rate | × round-robin | from device | TTFT p50 | TTFT p99 "
        "| imbalance p99 | × round-robin |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r.workload, r.engines): r for r in results if r.policy == "round-robin"}
    for r in results:
        rr = base.get((r.workload, r.engines))
        hit_x = f"{r.hit_rate / rr.hit_rate:.2f}×" if rr and rr.hit_rate else "-"
        imb_x = f"{r.imbalance_p99 / rr.imbalance_p99:.2f}×" if rr else "-"
        lines.append(
            f"| {r.engines if by_engines else r.workload} | {r.policy} | {r.requests} | {r.hit_rate:.1%} | {hit_x} "
            f"| {r.device_share:.0%} "
            f"| {r.ttft_p50:.2f} s | {r.ttft_p99:.2f} s | {r.imbalance_p99:.2f} | {imb_x} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=16, help="simulated engines (8-64)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--scaling", default="8,64", help="engine counts for the scaling table (multiturn, quick); '' for none"
    )
    parser.add_argument("--quick", action="store_true", help="a third of the simulated time")
    parser.add_argument("--write-docs", action="store_true", help="rewrite this section of docs/benchmarks.md")
    parser.add_argument("--tune", action="store_true", help="grid-search the event-fed router's weights")
    parser.add_argument("--calibrate", action="store_true", help="time the real engine, rewrite the calibration")
    args = parser.parse_args()
    if args.calibrate:
        from bench.route_sim_calibrate import calibrate

        calibrate(CALIBRATION)
        return
    cost, sizes = load_cost(), TierSizes()
    if args.tune:
        from bench.route_sim_tune import tune

        tune(cost, sizes, WEIGHTS_FILE, seed=args.seed)
        return
    weights = load_weights()
    factor = 1 / 3 if args.quick else 1.0
    started = time.perf_counter()
    results = run_table(
        args.workloads.split(","), args.policies.split(","), args.engines, factor, args.seed, weights, cost, sizes
    )
    lines = table(results)
    print("\n".join(lines))
    scaling = []
    counts = [int(n) for n in args.scaling.split(",") if n]
    if counts:
        policies = ["round-robin", "sglang-approx", "event-fed"]
        # A quick run's own multiturn rows are the scaling table's at its engine count.
        rows = [r for r in results if r.workload == "multiturn" and r.policy in policies] if factor < 1 else []
        for n in sorted({*counts, args.engines} - ({args.engines} if rows else set())):
            rows += run_table(["multiturn"], policies, n, 1 / 3, args.seed, weights, cost, sizes)
        scaling = table(sorted(rows, key=lambda r: (r.engines, policies.index(r.policy))), by_engines=True)
        print("\n".join(scaling))
    print(f"({time.perf_counter() - started:.1f} s)")
    if args.write_docs:
        from bench.route_sim_report import write_docs

        write_docs(
            results,
            lines,
            cost=cost,
            sizes=sizes,
            weights=weights,
            engines=args.engines,
            factor=factor,
            scaling=scaling,
        )


if __name__ == "__main__":
    main()
