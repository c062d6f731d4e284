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
- imbalance p99: sampled every simulated second until the last arrival, the busiest engine's
  in-flight requests (queued + prefilling + decoding); its 99th percentile over time divided
  by the time-average of the mean over engines. 1.0 would be perfect balance. (Not the p99 of
  each second's max/mean: that ratio blows up in quiet seconds, and so penalises a router for
  finishing requests sooner.)
Not a test: nothing here asserts; tests/bench/test_route_sim.py checks the ordering.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import sys
import time
from dataclasses import dataclass, replace
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
    imbalance_p99: float  # p99 over time of the busiest engine's in-flight requests / the time-mean per engine
    busiest_p99: float  # p99 over time of the busiest engine's in-flight requests
    predicted_over_actual: float  # router's predicted hit blocks / the engines' actual, summed
    gateways: int = 1


def simulate(
    requests: list[SimRequest],
    policy: str,
    *,
    engines: int,
    cost: CostModel,
    sizes: TierSizes,
    weights: RouteWeights,
    event_delay_s: float = 0.0,
    gateways: int = 1,
    workload: str = "",
) -> RunResult:
    """One policy on one request list. With `gateways` > 1, each request goes through one of that many
    router replicas (by session and turn, as a load balancer in front would spread them), each with its
    own state; every replica's index gets every engine's events, as each would from NATS."""
    replicas = [POLICIES[policy](weights, sizes.device_blocks) for _ in range(gateways)]
    sinks = [sink for _, sink in replicas if sink is not None]
    heap: list[tuple] = []
    order = itertools.count()

    def push(at: float, kind: int, payload: object = None) -> None:
        heapq.heappush(heap, (at, kind, next(order), payload))

    def deliver(batch: KVEventBatch, now: float) -> None:
        for sink in sinks:
            sink(batch, now)

    def publish(batch: KVEventBatch) -> None:
        if not sinks:
            return
        if event_delay_s <= 0:
            deliver(batch, batch.ts)
        else:
            push(batch.ts + event_delay_s, _EVENTS, batch)

    sims = {f"engine-{i:02d}": SimEngine(f"engine-{i:02d}", sizes, cost, publish) for i in range(engines)}
    for r in requests:
        push(T0 + r.arrival, _ARRIVE, r)
    end = T0 + (requests[-1].arrival if requests else 0.0)
    push(T0, _SAMPLE)
    push(T0 + 10.0, _SWEEP)
    jobs: list[Job] = []
    busiest: list[int] = []  # each simulated second until the last arrival: the most in flight on one engine
    mean_active: list[float] = []  # ... and the mean over engines
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
            router = replicas[(req.session * 7919 + req.turn) % gateways][0]
            decision = router.choose(req.block_hashes, loads, ttl_s=ttl, now=now)
            engine = sims[decision.engine]
            limit = (req.prompt_tokens - 1) // BLOCK_SIZE
            dev, host = engine.cached_prefix(req.block_hashes, now, limit)
            job = Job(req, (router, decision), now, req.prompt_tokens - (dev + host) * BLOCK_SIZE)
            engine.enqueue(job)
            start(engine, now)
        elif kind == _PREFILLED:
            engine = payload
            job = engine.finish_prefill(now)
            jobs.append(job)
            hits = job.device_hits + job.host_hits
            router, decision = job.decision
            router.record_actual(decision, hits)
            predicted += decision.predicted_hit_blocks
            actual += hits
            push(now + engine.decode_s(job), _DECODED, engine)
            start(engine, now)
        elif kind == _DECODED:
            payload.finish_decode()
        elif kind == _EVENTS:
            deliver(payload, now)
        elif kind == _SAMPLE:
            active = [s.active for s in sims.values()]
            busiest.append(max(active))
            mean_active.append(sum(active) / len(active))
            if now < end:
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
        imbalance_p99=float(np.percentile(busiest, 99) / np.mean(mean_active)) if np.mean(mean_active) else 1.0,
        busiest_p99=float(np.percentile(busiest, 99)),
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
    gateways: int = 1,
) -> list[RunResult]:
    results = []
    for name in workloads:
        requests = generate(scaled(WORKLOADS[name], factor), engines, seed, lambda n: cost.prefill_s(n, 0, 0))
        for policy in policies:
            run = simulate(
                requests,
                policy,
                engines=engines,
                cost=cost,
                sizes=sizes,
                weights=weights,
                gateways=gateways,
                workload=name,
            )
            results.append(replace(run, gateways=gateways))
    return results


def table(results: list[RunResult], *, first: str = "workload") -> list[str]:
    """Markdown rows; × round-robin compares with round-robin's row of the same workload, engines, gateways."""
    lines = [
        f"| {first} | policy | requests | hit rate | × round-robin | from device | TTFT p50 | TTFT p99 "
        "| busiest engine p99 | imbalance p99 | × round-robin |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r.workload, r.engines, r.gateways): r for r in results if r.policy == "round-robin"}
    for r in results:
        rr = base.get((r.workload, r.engines, r.gateways))
        hit_x = f"{r.hit_rate / rr.hit_rate:.2f}×" if rr and rr.hit_rate else "-"
        imb_x = f"{r.imbalance_p99 / rr.imbalance_p99:.2f}×" if rr else "-"
        lines.append(
            f"| {getattr(r, first)} | {r.policy} | {r.requests} | {r.hit_rate:.1%} | {hit_x} | {r.device_share:.0%} "
            f"| {r.ttft_p50:.2f} s | {r.ttft_p99:.2f} s | {r.busiest_p99:.0f} | {r.imbalance_p99:.2f} | {imb_x} |"
        )
    return lines


def extra_tables(
    args: argparse.Namespace,
    results: list[RunResult],
    weights: RouteWeights,
    cost: CostModel,
    sizes: TierSizes,
    quick: bool,
) -> list[tuple[str, list[str]]]:
    """The scaling table (multiturn at other engine counts) and the replicas table (several gateways)."""
    out = []
    policies = ["round-robin", "sglang-approx", "routed-only", "event-fed"]
    counts = [int(n) for n in args.scaling.split(",") if n]
    if counts:
        # A quick run's own multiturn rows are the scaling table's at its engine count.
        rows = [r for r in results if r.workload == "multiturn" and r.policy in policies] if quick else []
        for n in sorted({*counts, args.engines} - ({args.engines} if rows else set())):
            rows += run_table(["multiturn"], policies, n, 1 / 3, args.seed, weights, cost, sizes)
        rows.sort(key=lambda r: (r.engines, policies.index(r.policy)))
        title = "Scaling: multiturn, a third of the time, the same offered load per engine"
        out.append((title, table(rows, first="engines")))
    if args.gateways > 1:
        rows = []
        for g in (1, args.gateways):
            rows += run_table(["multiturn"], policies, args.engines, 1 / 3, args.seed, weights, cost, sizes, g)
        title = (
            f"Gateway replicas: multiturn at {args.engines} engines, a third of the time; each turn through one "
            "of the replicas (by session and turn), each replica with its own router state"
        )
        out.append((title, table(rows, first="gateways")))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=16, help="simulated engines (8-64)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scaling", default="8,64", help="engine counts for the scaling table; '' for none")
    parser.add_argument("--gateways", type=int, default=4, help="replicas for the gateway-replicas table; 1: none")
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
    extra = extra_tables(args, results, weights, cost, sizes, args.quick)
    for title, rows in extra:
        print(f"\n{title}\n" + "\n".join(rows))
    print(f"({time.perf_counter() - started:.1f} s)")
    if args.write_docs:
        from bench.route_sim_report import write_docs

        write_docs(
            results, lines, cost=cost, sizes=sizes, weights=weights, engines=args.engines, factor=factor, extra=extra
        )


if __name__ == "__main__":
    main()
