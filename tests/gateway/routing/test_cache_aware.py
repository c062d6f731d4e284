"""CacheAwareRouter: the cost function's choices, the imbalance override, the minimum match, popular
prefixes, fallback insertion, and the predicted-vs-actual metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.routing.cache_aware import CacheAwareRouter, NoHealthyEngine, RouteWeights
from gateway.routing.index import BlockIndex
from gateway.routing.metrics import RoutingMetrics
from gateway.routing.types import EngineLoad
from inference.hashing import BlockHasher
from kvgate.kv_events import BlockStored, KVEventBatch
from kvgate.settings_table import settings_table

NOW = 1_000_000.0
HASHER = BlockHasher(model_id="m", block_size=4)
IDLE = EngineLoad(active=0, queued_prefill_tokens=0)


def blocks(n: int, salt: str = "s", start: int = 0) -> list[bytes]:
    return HASHER.hash_blocks(list(range(start, start + 4 * n)), salt)


def holding(engine: str, hashes, medium: str = "CPU", index: BlockIndex | None = None) -> BlockIndex:
    index = index or BlockIndex()
    event = BlockStored(list(hashes), None, [], 4, medium=medium, expires_at=NOW + 300)
    index.apply(engine, KVEventBatch(ts=NOW, events=[event], seq=1, engine_id=engine), now=NOW)
    return index


# The load weights these cases are built on (a request in flight costs 2 blocks, a queued token 1/16);
# the defaults (tuned by bench/route_sim.py) price load higher.
TEST_WEIGHTS = {"w_load": 2.0, "w_queue": 1 / 16}


def evented(index: BlockIndex, **weights) -> CacheAwareRouter:
    return CacheAwareRouter(index, RouteWeights(**{**TEST_WEIGHTS, **weights}), has_events=lambda engine: True)


def test_the_engine_holding_the_prefix_wins():
    request = blocks(10)
    router = evented(holding("b", request[:8]))
    loads = {"a": IDLE, "b": EngineLoad(active=3, queued_prefill_tokens=16)}
    decision = router.choose(request, loads, ttl_s=300, now=NOW)
    assert decision == ("b", 8, "prefix")
    # Without the prefix anywhere, the load decides.
    other = blocks(10, salt="other tenant")
    assert router.choose(other, loads, ttl_s=300, now=NOW) == ("a", 0, "least_loaded")


def test_device_beats_lower_beats_shared_and_load_can_outweigh_them():
    request = blocks(10)
    index = holding("dev", request)
    holding("host", request, "HOST", index)
    router = evented(index, alpha=0.8, beta=0.6, w_load=2.0)
    loads = {"dev": IDLE, "host": IDLE, "none": IDLE}
    costs = router.costs(request, loads, now=NOW)
    assert costs == {"dev": 0.0, "host": pytest.approx(2.0), "none": 10.0}
    assert router.choose(request, loads, ttl_s=300, now=NOW).engine == "dev"
    busy = {**loads, "dev": EngineLoad(active=2, queued_prefill_tokens=0)}  # cost 4 > the host copy's 2
    assert router.choose(request, busy, ttl_s=300, now=NOW) == ("host", 10, "prefix")
    # The shared tier's credit reaches every engine.
    shared = evented(holding("x", request, "REMOTE"), beta=0.6)
    assert shared.costs(request, {"p": IDLE, "q": IDLE}, now=NOW) == {"p": pytest.approx(4.0), "q": pytest.approx(4.0)}


def test_imbalance_sends_to_the_least_loaded():
    request = blocks(40)
    router = evented(holding("b", request), imbalance_abs=16, imbalance_rel=1.5, w_load=0.5)
    within = {"a": EngineLoad(2, 0), "b": EngineLoad(18, 0)}  # 16 apart: not over the threshold
    assert router.choose(request, within, ttl_s=300, now=NOW) == ("b", 40, "prefix")
    over = {"a": EngineLoad(2, 0), "b": EngineLoad(19, 0)}
    assert router.choose(request, over, ttl_s=300, now=NOW) == ("a", 0, "imbalance")
    # The relative half: 17 apart but 60 vs 43 is under 1.5x.
    close = {"a": EngineLoad(43, 0), "b": EngineLoad(60, 0)}
    assert router.choose(request, close, ttl_s=300, now=NOW).reason == "prefix"


def test_a_match_shorter_than_the_minimum_counts_as_none():
    request = blocks(10)
    loads = {"a": IDLE, "b": EngineLoad(active=1, queued_prefill_tokens=0)}
    short = evented(holding("b", request[:2]), min_match_blocks=3)
    assert short.choose(request, loads, ttl_s=300, now=NOW) == ("a", 0, "least_loaded")
    long_enough = evented(holding("b", request[:3]), min_match_blocks=3)
    assert long_enough.choose(request, loads, ttl_s=300, now=NOW) == ("b", 3, "prefix")


def test_a_popular_prefix_spreads_by_load_and_sessions_still_stick():
    system = blocks(8)  # one tenant's system prompt, held by engine a only
    router = evented(holding("a", system), popular_requests=3, popular_spread_load=2, w_load=1.0, pending_s=0)
    loads = {"a": EngineLoad(4, 0), "b": IDLE, "c": IDLE}
    sessions = [system + blocks(4, start=1000 + 100 * i) for i in range(6)]
    chosen = [router.choose(s, loads, ttl_s=300, now=NOW) for s in sessions]
    # The first three go to the holder (a 4-request load costs less than 8 blocks of prefill) ...
    assert [d.engine for d in chosen[:3]] == ["a"] * 3
    assert {d.reason for d in chosen[:3]} == {"prefix"}
    # ... then the prefix counts as popular, worth 2 requests of load only: a is busier than that.
    assert {d.engine for d in chosen[3:]} <= {"b", "c"}
    assert {d.reason for d in chosen[3:]} == {"least_loaded"}
    # Within that margin the holder keeps it.
    slightly_busy = {"a": EngineLoad(1, 0), "b": IDLE, "c": IDLE}
    assert router.choose(system + blocks(4, start=7000), slightly_busy, ttl_s=300, now=NOW) == ("a", 8, "popular")
    # A session's next turn matches past the system prompt, to its own blocks, and sticks.
    turn2 = sessions[0] + blocks(2, start=5000)
    holding("a", sessions[0], index=router.index)
    assert router.choose(turn2, loads, ttl_s=300, now=NOW + 10) == ("a", 12, "prefix")
    # With popular_spread_load 0 a popular prefix goes by load alone; a holder still wins a tie.
    by_load = evented(holding("a", system), popular_requests=1, popular_spread_load=0, pending_s=0)
    by_load.choose(system + blocks(4, start=8000), slightly_busy, ttl_s=300, now=NOW)
    assert by_load.choose(system + blocks(4, start=8100), slightly_busy, ttl_s=300, now=NOW).engine != "a"
    equal = {"a": IDLE, "b": IDLE, "c": IDLE}
    assert by_load.choose(system + blocks(4, start=9000), equal, ttl_s=300, now=NOW) == ("a", 8, "least_loaded")


def test_fallback_insertion_makes_the_second_turn_stick():
    turn1 = blocks(6)
    turn2 = turn1 + blocks(3, start=500)
    loads = {"a": IDLE, "b": IDLE}
    without_events = CacheAwareRouter(BlockIndex(), RouteWeights(**TEST_WEIGHTS))
    first = without_events.choose(turn1, loads, ttl_s=300, now=NOW)
    other = "b" if first.engine == "a" else "a"
    busier = {first.engine: EngineLoad(1, 0), other: IDLE}
    assert without_events.choose(turn2, busier, ttl_s=300, now=NOW + 5) == (first.engine, 6, "prefix")
    # After the TTL (from the last insertion), nothing is remembered.
    assert without_events.choose(turn2, busier, ttl_s=300, now=NOW + 306) == (other, 0, "least_loaded")
    # An engine whose events reach the index gets no lasting insertion: the second turn goes by load ...
    with_events = evented(BlockIndex(), pending_s=0)
    first = with_events.choose(turn1, loads, ttl_s=300, now=NOW)
    other = "b" if first.engine == "a" else "a"
    busier = {first.engine: EngineLoad(1, 0), other: IDLE}
    assert with_events.choose(turn2, busier, ttl_s=300, now=NOW + 5) == (other, 0, "least_loaded")
    # ... unless it comes before the engine's events could (pending_s): a burst of one prefix stays together.
    pending = evented(BlockIndex(), pending_s=10)
    first = pending.choose(turn1, loads, ttl_s=300, now=NOW)
    other = "b" if first.engine == "a" else "a"
    busier = {first.engine: EngineLoad(1, 0), other: IDLE}
    assert pending.choose(turn2, busier, ttl_s=300, now=NOW + 5) == (first.engine, 6, "prefix")
    assert pending.choose(turn2, busier, ttl_s=300, now=NOW + 16) == (other, 0, "least_loaded")


def test_unhealthy_engines_are_skipped_and_ties_spread():
    router = evented(BlockIndex())
    loads = {"a": IDLE, "b": EngineLoad(0, 0, healthy=False), "c": IDLE}
    picks = {router.choose(blocks(2, salt=f"t{i}"), loads, ttl_s=0, now=NOW).engine for i in range(40)}
    assert picks == {"a", "c"}
    assert router.choose(blocks(2), {"c": IDLE}, ttl_s=0, now=NOW) == ("c", 0, "single")
    # Requests without a full block spread too.
    assert {router.choose([], loads, ttl_s=0, now=NOW).engine for _ in range(40)} == {"a", "c"}
    with pytest.raises(NoHealthyEngine):
        router.choose(blocks(2), {"b": EngineLoad(0, 0, healthy=False)}, ttl_s=0, now=NOW)


def test_predicted_and_actual_hits_are_exported():
    registry = CollectorRegistry(auto_describe=False)
    metrics = RoutingMetrics(registry)
    request = blocks(5)
    router = CacheAwareRouter(holding("a", request), block_size=4, has_events=lambda e: True, metrics=metrics)
    decision = router.choose(request, {"a": IDLE, "b": IDLE}, ttl_s=300, now=NOW)
    router.record_actual(decision, actual_hit_blocks=3)
    value = registry.get_sample_value
    assert value("kvgate:router_predicted_hit_tokens_total", {"engine": "a"}) == 20
    assert value("kvgate:router_actual_hit_tokens_total", {"engine": "a"}) == 12
    assert value("kvgate:router_decisions_total", {"engine": "a", "reason": "prefix"}) == 1
    assert value("kvgate:router_index_entries") == 5
    assert value("kvgate:router_decisions_total", {"engine": "b", "reason": "prefix"}) is None


def test_weights_come_from_the_gateway_settings(monkeypatch):
    from gateway.settings import GatewaySettings

    monkeypatch.setenv("KVGATE_ROUTE_ALPHA", "0.5")
    monkeypatch.setenv("KVGATE_ROUTE_MIN_MATCH_BLOCKS", "7")
    weights = RouteWeights.from_settings(GatewaySettings())
    assert weights.alpha == 0.5 and weights.min_match_blocks == 7
    assert RouteWeights.from_settings(GatewaySettings(_env_file=None)).beta == RouteWeights().beta
    assert "`KVGATE_ROUTE_W_LOAD`" in settings_table() and "`KVGATE_NATS_URL`" in settings_table()


def test_engine_weights_scale_the_load():
    request = blocks(4, salt="new")
    loads = {"small": EngineLoad(2, 0), "big": EngineLoad(3, 0)}
    assert evented(BlockIndex()).choose(request, loads, ttl_s=0, now=NOW).engine == "small"
    weighted = CacheAwareRouter(
        BlockIndex(), RouteWeights(**TEST_WEIGHTS), engine_weights={"big": 2.0}, has_events=lambda e: True
    )
    assert weighted.choose(request, loads, ttl_s=0, now=NOW).engine == "big"  # 3/2 < 2
    assert weighted.costs(request, loads, now=NOW) == {"small": 8.0, "big": 7.0}
