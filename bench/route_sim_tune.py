"""`bench/route_sim.py --tune`: a small grid search of the event-fed router's weights, in simulation.

Coordinate search over a grid (each weight swept over its values with the others held, two
rounds), at 16 engines on the multiturn and bursts workloads and on multiturn with device pools
of 256 blocks (engines evicting to their host tiers), a third of the default time each.
A setting is admissible when, on every workload, its p99 imbalance is within 1.3× round-
robin's and its p99 TTFT no worse than round-robin's; among admissible ones the highest mean
hit rate, to the point, wins (ties: the less imbalanced to 0.01, then the lower mean p99 TTFT to 0.1 s); while none
is admissible, the least imbalanced leads. A setting moves only when strictly better, so ties keep
the router's defaults. Not searched: β (the shared
tier's weight: the simulated engines have no shared tier, so it never changes a choice) and
popular_half_life_s.
Writes bench/route_sim_weights.json, which the default run uses.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench.route_sim_engines import CostModel, TierSizes
from bench.route_sim_workloads import WORKLOADS, generate, scaled
from gateway.routing.cache_aware import RouteWeights

GRID: dict[str, tuple[float, ...]] = {
    "w_load": (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
    "w_queue": (0.0, 1 / 64, 1 / 16, 1 / 4),
    "min_match_blocks": (0, 2, 4, 8),
    "imbalance_abs": (4, 8, 16, 32),
    "imbalance_rel": (1.2, 1.5, 2.0),
    "popular_requests": (4.0, 8.0, 16.0, 1e9),
    "popular_spread_load": (0.0, 2.0, 4.0, 8.0),
    "pending_s": (0.0, 10.0),
    "alpha": (0.0, 0.5, 0.8, 1.0),
}
# (label, workload, device pool in blocks or None for the default): the small pool makes engines evict
# to their host tiers, so that α (the credit for a host-tier block) has something to decide.
TUNE_WORKLOADS = (("multiturn", "multiturn", None), ("bursts", "bursts", None), ("multiturn-256", "multiturn", 256))
ENGINES = 16
IMBALANCE_LIMIT = 1.3


def tune(cost: CostModel, sizes: TierSizes, out: Path, *, seed: int = 1, factor: float = 1 / 3) -> RouteWeights:
    from bench.route_sim import simulate  # the simulator imports this module lazily

    started = time.perf_counter()
    workloads = {
        label: (
            generate(scaled(WORKLOADS[name], factor), ENGINES, seed, lambda n: cost.prefill_s(n, 0, 0)),
            sizes if blocks is None else replace(sizes, device_blocks=blocks),
        )
        for label, name, blocks in TUNE_WORKLOADS
    }
    base = {
        label: simulate(
            reqs, "round-robin", engines=ENGINES, cost=cost, sizes=pool, weights=RouteWeights(), workload=label
        )
        for label, (reqs, pool) in workloads.items()
    }
    seen: dict[RouteWeights, tuple] = {}

    def score(weights: RouteWeights) -> tuple:
        if weights not in seen:
            runs = [
                simulate(reqs, "event-fed", engines=ENGINES, cost=cost, sizes=pool, weights=weights, workload=label)
                for label, (reqs, pool) in workloads.items()
            ]
            ok = all(
                r.imbalance_p99 <= IMBALANCE_LIMIT * base[r.workload].imbalance_p99
                and r.ttft_p99 <= base[r.workload].ttft_p99
                for r in runs
            )
            hit = sum(r.hit_rate for r in runs) / len(runs)
            p99 = sum(r.ttft_p99 for r in runs) / len(runs)
            imbalance = max(r.imbalance_p99 / base[r.workload].imbalance_p99 for r in runs)
            # Admissible settings rank by hit rate to the point (closer is noise), then balance, then p99 TTFT;
            # while none is admissible, the least imbalanced leads the search.
            rank = round(hit, 2) if ok else -imbalance
            seen[weights] = (ok, rank, -round(imbalance, 2), -round(p99, 1), imbalance, hit)
        return seen[weights]

    best = RouteWeights()
    for _ in range(2):
        for name, values in GRID.items():
            for value in values:
                candidate = replace(best, **{name: type(getattr(best, name))(value)})
                if score(candidate)[:4] > score(best)[:4]:  # the rank; the rest is for the report
                    best = candidate
    ok, _, _, neg_p99, imbalance, hit = score(best)
    # Weights whose every value, the others at the chosen ones, changed neither hit rate nor balance noticeably.
    flat = []
    for name in GRID:
        around = [sc for w, sc in seen.items() if asdict(replace(w, **{name: getattr(best, name)})) == asdict(best)]
        if len(around) > 1 and all(abs(sc[5] - hit) < 0.005 and abs(sc[4] - imbalance) < 0.03 for sc in around):
            flat.append(name)
    report = {
        "weights": asdict(best),
        "no_effect_here": flat,
        "objective": "max mean hit rate (to the point; ties: less imbalance, then lower p99 TTFT) with p99 "
        "imbalance <= 1.3x round-robin's and p99 TTFT <= round-robin's, on every workload",
        "admissible": ok,
        "mean_hit_rate": round(hit, 3),
        "round_robin_mean_hit_rate": round(sum(r.hit_rate for r in base.values()) / len(base), 3),
        "mean_ttft_p99_s": round(-neg_p99, 3),
        "worst_imbalance_vs_round_robin": round(imbalance, 3),
        "settings_tried": len(seen),
        "trials": [
            {
                "changed": {k: v for k, v in asdict(w).items() if v != asdict(RouteWeights())[k]},
                "admissible": sc[0],
                "hit": round(sc[5], 3),
                "ttft_p99": round(-sc[3], 1),
                "imbalance_x": round(sc[4], 2),
            }
            for w, sc in seen.items()
        ],
        "grid": {k: list(v) for k, v in GRID.items()},
        "workloads": list(workloads),
        "engines": ENGINES,
        "calibration": cost.source,
        "tuned_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"({time.perf_counter() - started:.0f} s)")
    return best
