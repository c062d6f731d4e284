"""`bench/route_sim.py --write-docs`: the simulator's section of docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict

from bench.report import machine_description, write_section
from bench.route_sim_engines import CALIBRATION, CostModel, TierSizes
from bench.route_sim_workloads import WORKLOADS
from gateway.routing.cache_aware import RouteWeights

TARGET_HIT_X, TARGET_IMBALANCE_X = 1.5, 1.3


def verdict(results: Sequence, workload: str = "multiturn", engines: int = 16) -> str:
    by = {r.policy: r for r in results if r.workload == workload and r.engines == engines}
    if "round-robin" not in by or "event-fed" not in by:
        return ""
    rr, ev = by["round-robin"], by["event-fed"]
    hit_x, imb_x = ev.hit_rate / rr.hit_rate, ev.imbalance_p99 / rr.imbalance_p99
    met = hit_x >= TARGET_HIT_X and imb_x <= TARGET_IMBALANCE_X
    return (
        f"Target (issue 16), {workload} at {engines} engines: event-fed hit rate ≥ {TARGET_HIT_X}× round-robin's "
        f"with p99 imbalance within {TARGET_IMBALANCE_X}× round-robin's: {hit_x:.2f}× and {imb_x:.2f}×, "
        f"{'met' if met else 'NOT met'}."
    )


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def write_docs(
    results: Sequence,
    lines: list[str],
    *,
    cost: CostModel,
    sizes: TierSizes,
    weights: RouteWeights,
    engines: int,
    factor: float,
    extra: Sequence[tuple[str, list[str]]] = (),
) -> None:
    calib = json.loads(CALIBRATION.read_text()) if CALIBRATION.exists() else {}
    w = asdict(weights)
    router = "gateway.routing's BlockIndex and CacheAwareRouter"
    specs = [WORKLOADS[name] for name in dict.fromkeys(r.workload for r in results)]
    body = [
        f"Simulated on: {machine_description()} (load average {os.getloadavg()[0]:.2f} at the end), "
        f"at commit {_commit()}, with {router}.",
        "",
        f"Calibration (bench/route_sim_calibration.json, `--calibrate`): the real {calib.get('model', 'SmolLM2')} "
        f"engine on {calib.get('machine', '?')}, {calib.get('measured_at', '?')}, load average "
        f"{calib.get('load_average', '?')}: prefill = {cost.a * 1000:.0f} ms + {cost.b * 1e3:.2f} ms × uncached tokens "
        f"+ {cost.c * 1e6:.0f} µs × cached tokens + {cost.h * 1e6:.0f} µs × host-tier tokens; decode "
        f"{cost.d * 1000:.0f} ms per token per stream (8 streams). The cores are shared with other work, so these "
        "are slower than the engine section's quiet-machine numbers; the workloads' load is set relative to them.",
        "",
        f"Engines: {engines}, each with an LRU device pool of {sizes.device_blocks} blocks and a host tier of "
        f"{sizes.host_blocks} blocks, TTL {sizes.ttl_s:.0f} s; prefills one at a time in arrival order; every "
        "change to the tiers published as a KV event batch (BlockStored/BlockRemoved, media CPU/HOST, expires_at) "
        "into the router's index, in process, at once (`--event-delay` delays them).",
        "",
        "Workloads (bench/route_sim_workloads.py, seed 1, real salted chained block hashes, one salt per tenant):",
        "",
    ]
    for spec in specs:
        turns = "single-turn" if spec.mean_turns <= 1 else f"~{spec.mean_turns:.0f} turns per session"
        bursts = (
            f"; every {spec.burst_every_s:.0f} s one tenant opens {spec.burst_sessions} sessions within 2 s"
            if spec.burst_every_s
            else ""
        )
        body.append(
            f"- {spec.name}: {spec.tenants} Zipf({spec.zipf_s}) tenants, system prompts {spec.system_min}-"
            f"{spec.system_max} tokens shared within a tenant, {turns} (user {spec.user_min}-{spec.user_max}, "
            f"replies {spec.reply_min}-{spec.reply_max} tokens, think time ~{spec.think_mean_s:.0f} s){bursts}; "
            f"offered load {spec.offered_load} (cold prefill work / engine time)."
        )
    tuned = _tuning()
    if tuned:
        flat = ", ".join(tuned.get("no_effect_here", [])) or "none"
        body += [
            "",
            f"Weights tuned with `--tune` ({tuned['tuned_at']}; bench/route_sim_weights.json): a coordinate grid "
            f"search, {tuned['settings_tried']} settings, on {', '.join(tuned['workloads'])} (-256: device pools of "
            f"256 blocks, so engines evict to their host tiers) at "
            f"{tuned['engines']} engines, a third of the time; objective: {tuned['objective']}. Chosen: "
            + ", ".join(f"{k} {v:g}" for k, v in tuned["weights"].items())
            + f" (mean hit rate {tuned['mean_hit_rate']:.1%} vs round-robin's "
            f"{tuned['round_robin_mean_hit_rate']:.1%}, worst imbalance {tuned['worst_imbalance_vs_round_robin']}× "
            f"round-robin's). No measurable effect here, so not really chosen: {flat} (β is not searched: the "
            "simulated engines have no shared tier).",
        ]
    body += [
        "",
        "Hit rate: prompt tokens read from a cache / prompt tokens. TTFT: queue wait + prefill (simulated s). "
        "Busiest engine p99: sampled each simulated second until the last arrival, the most requests in flight "
        "(queued, prefilling or decoding) on one engine; its 99th percentile over time. Imbalance p99: that divided "
        "by the time-average of the mean in flight per engine (1.0 would be perfect balance; not the p99 of each "
        "second's max/mean, which blows up in quiet seconds and so penalises a router for finishing sooner). "
        "Routed-only and event-fed weights, this run: " + ", ".join(f"{k} {v:g}" for k, v in w.items()) + ".",
        "",
        "Policies: round-robin; least-loaded (fewest in flight, then fewest queued prefill tokens); consistent-hash "
        "(a ring with 64 virtual nodes per engine, on the first block's hash); sglang-approx (SGLang's cache_aware "
        "on a per-engine tree of the block hashes it routed there, bounded to the device pool: the best match "
        "(least loaded among equals) if over "
        "0.3 of the request, else the smallest tree; least loaded when max − min > 64 and max > 1.5 × min); "
        "routed-only (kvgate's CacheAwareRouter with no events, on its fallback: the hashes it routed, for their TTL); "
        "event-fed (the same router, its BlockIndex fed by the engines' events, plus its own choices for pending_s "
        "until their events arrive). "
        f"{'A third of the default time (`--quick`). ' if factor < 1 else ''}",
        "",
        *lines,
        "",
        verdict(results, engines=engines),
    ]
    for title, rows in extra:
        body += ["", f"{title}:", "", *rows]
    write_section("route-sim", "Prefix routing simulator (bench/route_sim.py)", body)


def _tuning() -> dict:
    from bench.route_sim import WEIGHTS_FILE

    return json.loads(WEIGHTS_FILE.read_text()) if WEIGHTS_FILE.exists() else {}
