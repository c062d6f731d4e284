"""The routing simulator (bench/route_sim.py) on tiny workloads: paired checks, never timings."""

from __future__ import annotations

from dataclasses import replace

from bench.route_sim import load_cost, simulate
from bench.route_sim_engines import CostModel, Job, SimEngine, TierSizes
from bench.route_sim_policies import SGLangApprox
from bench.route_sim_workloads import WORKLOADS, SimRequest, generate, scaled
from gateway.routing.cache_aware import RouteWeights
from gateway.routing.types import EngineLoad
from inference.hashing import BlockHasher
from kvgate.kv_events import BlockRemoved, BlockStored, KVEventBatch

COST = CostModel(a=0.01, b=0.001, c=0.00001, h=0.000005, d=0.03)
SIZES = TierSizes(device_blocks=512, host_blocks=1024, ttl_s=300)


def tiny(name: str, engines: int) -> list[SimRequest]:
    spec = replace(scaled(WORKLOADS[name], 0.08), tenants=12)
    return generate(spec, engines, seed=3, cold_prefill_s=lambda n: COST.prefill_s(n, 0, 0))


def test_event_fed_router_reads_more_than_round_robin_on_the_same_requests() -> None:
    requests = tiny("multiturn", 8)
    assert len(requests) > 50 and any(r.turn > 0 for r in requests)
    runs = {
        policy: simulate(requests, policy, engines=8, cost=COST, sizes=SIZES, weights=RouteWeights(), workload="t")
        for policy in ("round-robin", "event-fed")
    }
    assert runs["round-robin"].requests == runs["event-fed"].requests == len(requests)
    assert runs["event-fed"].hit_rate > runs["round-robin"].hit_rate
    assert 0 < runs["round-robin"].hit_rate < 1


def test_events_keep_gateway_replicas_in_step_where_routed_only_state_diverges() -> None:
    requests = tiny("multiturn", 8)

    def hit(policy: str, gateways: int) -> float:
        run = simulate(requests, policy, engines=8, cost=COST, sizes=SIZES, weights=RouteWeights(), gateways=gateways)
        return run.hit_rate

    # One gateway: its own routing history is as good as events here; three replicas each see a third of it.
    assert hit("routed-only", 1) > hit("round-robin", 1)
    assert hit("event-fed", 3) > hit("routed-only", 3)


def test_workloads_are_deterministic_and_salted_per_tenant() -> None:
    first, again = tiny("sysprompt", 8), tiny("sysprompt", 8)
    assert [(r.arrival, tuple(r.block_hashes)) for r in first] == [(r.arrival, tuple(r.block_hashes)) for r in again]
    by_tenant = {}
    for r in first:
        by_tenant.setdefault(r.tenant, set()).add(r.block_hashes[0])
    assert len(by_tenant) > 1
    # Within a tenant the system prompt's first block is shared; across tenants nothing is.
    assert all(len(firsts) == 1 for firsts in by_tenant.values())
    assert len(set().union(*by_tenant.values())) == len(by_tenant)


def test_a_later_turn_extends_the_previous_turns_hash_chain() -> None:
    requests = generate(replace(WORKLOADS["multiturn"], duration_s=20, tenants=3), 8, seed=5)
    turns = [r for r in requests if r.turn == 1]
    assert turns
    later = turns[0]
    earlier = next(r for r in requests if r.session == later.session and r.turn == 0)
    assert list(later.block_hashes[: earlier.num_blocks]) == list(earlier.block_hashes)
    assert later.num_blocks > earlier.num_blocks


def test_engine_reads_its_own_tenants_blocks_and_never_another_salts() -> None:
    batches: list[KVEventBatch] = []
    engine = SimEngine("e0", SIZES, COST, batches.append)
    hasher = BlockHasher(model_id="m", block_size=16)
    tokens = list(range(100, 100 + 320))

    def run(salt: str, now: float) -> Job:
        hashes = hasher.hash_blocks(tokens, salt)
        engine.enqueue(Job(SimRequest(0.0, 0, 0, 0, len(tokens), 8, hashes, len(hashes)), None, now, 0))
        engine.start_next(now)
        return engine.finish_prefill(now + 1)

    assert run("tenant-a", 0.0).device_hits == 0
    assert run("tenant-a", 2.0).device_hits == (len(tokens) - 1) // 16  # the last token's block is recomputed
    assert run("tenant-b", 4.0).device_hits == 0
    stored = [e for b in batches for e in b.events if isinstance(e, BlockStored)]
    assert stored and all(e.medium == "CPU" and e.expires_at and not e.token_ids for e in stored)
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))


def test_device_evictions_move_to_the_host_tier_and_are_published() -> None:
    batches: list[KVEventBatch] = []
    engine = SimEngine("e0", TierSizes(device_blocks=20, host_blocks=100, ttl_s=300), COST, batches.append)
    hasher = BlockHasher(model_id="m", block_size=16)
    first = list(range(1000, 1000 + 16 * 15 + 1))
    for i, tokens in enumerate((first, list(range(5000, 5000 + 16 * 15 + 1)), first)):
        hashes = hasher.hash_blocks(tokens, "t")
        engine.enqueue(Job(SimRequest(0.0, 0, 0, 0, len(tokens), 8, hashes, len(hashes)), None, i * 10.0, 0))
        engine.start_next(i * 10.0)
        job = engine.finish_prefill(i * 10.0 + 1)
    assert job.host_hits > 0  # the first prompt came back from the host tier
    events = [e for b in batches for e in b.events]
    assert any(isinstance(e, BlockRemoved) and e.medium == "CPU" for e in events)
    assert any(isinstance(e, BlockStored) and e.medium == "HOST" for e in events)


def test_sglang_approx_follows_its_tree_until_the_load_is_imbalanced() -> None:
    router = SGLangApprox(balance_abs=4, balance_rel=1.5)
    hashes = [bytes([i]) * 16 for i in range(8)]
    even = {"a": EngineLoad(0, 0), "b": EngineLoad(0, 0)}
    first = router.choose(hashes, even, ttl_s=300, now=0).engine
    assert router.choose(hashes, even, ttl_s=300, now=1).engine == first
    other = "b" if first == "a" else "a"
    skewed = {first: EngineLoad(10, 0), other: EngineLoad(1, 0)}
    assert router.choose(hashes, skewed, ttl_s=300, now=2).engine == other


def test_the_committed_calibration_loads() -> None:
    cost = load_cost()
    assert cost.b > 0 and cost.d > 0 and cost.prefill_s(1000, 0, 0) > cost.prefill_s(10, 990, 0)
