"""The router used when nothing better is configured: weighted least-loaded, blind to prefixes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.routing.types import EngineLoad, RouteDecision
from inference.hashing import BlockHash

# A request's weight in the load score is one; queued prefill tokens count in units of this many
# tokens, so an engine with a long prompt still prefilling looks busier than one decoding.
PREFILL_TOKENS_PER_REQUEST = 1024


class LeastLoadedRouter:
    """Picks the healthy engine with the least load per unit of weight.

    load = (active + queued_prefill_tokens / 1024) / weight, so an engine of weight 2 takes twice
    the concurrent requests of one of weight 1. Ties (an idle pool) go to the engine that has been
    chosen least per unit of weight, so that sequential requests spread in proportion to the
    weights too; a full tie (nothing chosen yet) to the heaviest engine. `weights` is read at each call
    (the pool keeps it current as engines become known); an engine missing there weighs 1.
    """

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self.weights = weights if weights is not None else {}
        self._chosen: dict[str, int] = {}

    def choose(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float
    ) -> RouteDecision:
        candidates = [engine for engine, load in loads.items() if load.healthy]
        if not candidates:
            raise LookupError("no healthy engine to route to")

        def score(engine: str) -> tuple[float, float, float, str]:
            load, weight = loads[engine], self.weights.get(engine, 1.0)
            busy = load.active + load.queued_prefill_tokens / PREFILL_TOKENS_PER_REQUEST
            return busy / weight, self._chosen.get(engine, 0) / weight, -weight, engine

        engine = min(candidates, key=score)
        self._chosen[engine] = self._chosen.get(engine, 0) + 1
        return RouteDecision(engine=engine, predicted_hit_blocks=0, reason="least_loaded")

    def record_actual(self, decision: RouteDecision, actual_hit_blocks: int) -> None:
        """Nothing to learn: this router predicts no hits."""
