"""The default router: weighted least-loaded over the healthy engines."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.routing.least_loaded import LeastLoadedRouter
from gateway.routing.types import EngineLoad

IDLE = EngineLoad(active=0, queued_prefill_tokens=0)


def _choose(router: LeastLoadedRouter, loads: dict[str, EngineLoad]) -> str:
    return router.choose([], loads, ttl_s=300, now=0.0).engine


def test_sequential_requests_spread_by_weight() -> None:
    router = LeastLoadedRouter({"a": 2.0, "b": 1.0})
    counts = Counter(_choose(router, {"a": IDLE, "b": IDLE}) for _ in range(300))
    assert counts == {"a": 200, "b": 100}
    even = LeastLoadedRouter()
    assert Counter(_choose(even, {"a": IDLE, "b": IDLE, "c": IDLE}) for _ in range(30)) == {"a": 10, "b": 10, "c": 10}


def test_the_heaviest_idle_engine_goes_first() -> None:
    for names in (("a", "b"), ("b", "a")):
        router = LeastLoadedRouter({names[0]: 1.0, names[1]: 100.0})
        assert _choose(router, {names[0]: IDLE, names[1]: IDLE}) == names[1]


def test_the_least_loaded_per_weight_wins() -> None:
    router = LeastLoadedRouter({"a": 1.0, "b": 1.0})
    assert _choose(router, {"a": EngineLoad(3, 0), "b": EngineLoad(1, 0)}) == "b"
    # Queued prefill counts: a long prompt still prefilling makes an engine busier.
    assert _choose(router, {"a": EngineLoad(1, 0), "b": EngineLoad(1, 8192)}) == "a"
    heavy = LeastLoadedRouter({"a": 4.0, "b": 1.0})
    assert _choose(heavy, {"a": EngineLoad(3, 0), "b": EngineLoad(1, 0)}) == "a"
    decision = router.choose([], {"a": IDLE}, ttl_s=300, now=0.0)
    assert (decision.predicted_hit_blocks, decision.reason) == (0, "least_loaded")


def test_unhealthy_engines_get_nothing() -> None:
    router = LeastLoadedRouter()
    loads = {"a": EngineLoad(0, 0, healthy=False), "b": EngineLoad(50, 0)}
    assert {_choose(router, loads) for _ in range(10)} == {"b"}
    with pytest.raises(LookupError):
        _choose(router, {"a": EngineLoad(0, 0, healthy=False)})


def test_weights_are_read_at_each_choice() -> None:
    weights: dict[str, float] = {}
    router = LeastLoadedRouter(weights)
    weights["b"] = 10.0  # an engine that joined later, as the pool adds it
    assert _choose(router, {"a": EngineLoad(1, 0), "b": EngineLoad(5, 0)}) == "b"
