"""The routing policies bench/route_sim.py compares; each is a gateway.routing.types.Router.

- round_robin, least_loaded: no cache knowledge.
- consistent_hash: a hash ring (64 virtual nodes per engine) on the request's first block hash,
  so a tenant's system prompt always lands on the same engine, whatever the load.
- sglang_approx: SGLang's router's cache_aware policy, on block hashes instead of text: a
  per-engine approximate tree of the prefixes it routed there (LRU, bounded), the best
  match when the match rate is over cache_threshold, else the engine with the smallest
  tree; the least loaded when imbalanced (max − min > abs and max > rel × min running
  requests). Defaults are its published ones (0.3, 64, 1.5). It never hears from engines.
- routed-only: kvgate's CacheAwareRouter without events, on its fallback (the hashes it routed,
  with their TTL), as for engines whose events do not reach the gateway.
- event-fed: kvgate's gateway.routing CacheAwareRouter over a BlockIndex fed with the
  engines' KV events, the one under test.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from bench.route_sim_workloads import BLOCK_SIZE
from gateway.routing.cache_aware import CacheAwareRouter, RouteWeights
from gateway.routing.index import BlockIndex
from gateway.routing.types import EngineLoad, RouteDecision, Router
from inference.hashing import BlockHash
from kvgate.kv_events import KVEventBatch

EventSink = Callable[[KVEventBatch, float], None]  # a batch and the simulated time it arrives


def _healthy(loads: Mapping[str, EngineLoad]) -> list[str]:
    return [e for e, load in loads.items() if load.healthy]


def _least_loaded(loads: Mapping[str, EngineLoad], engines: Sequence[str]) -> str:
    return min(engines, key=lambda e: (loads[e].active, loads[e].queued_prefill_tokens))


class _NoFeedback:
    def record_actual(self, decision: RouteDecision, actual_hit_blocks: int) -> None:
        pass


class RoundRobin(_NoFeedback):
    def __init__(self) -> None:
        self._next = itertools.count()

    def choose(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float
    ) -> RouteDecision:
        engines = _healthy(loads)
        return RouteDecision(engines[next(self._next) % len(engines)], 0, "round_robin")


class LeastLoaded(_NoFeedback):
    def choose(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float
    ) -> RouteDecision:
        return RouteDecision(_least_loaded(loads, _healthy(loads)), 0, "least_loaded")


class ConsistentHash(_NoFeedback):
    def __init__(self, vnodes: int = 64) -> None:
        self.vnodes = vnodes
        self._ring: list[tuple[int, str]] = []
        self._engines: frozenset[str] = frozenset()

    @staticmethod
    def _point(data: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")

    def choose(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float
    ) -> RouteDecision:
        engines = _healthy(loads)
        if not block_hashes:
            return RouteDecision(_least_loaded(loads, engines), 0, "least_loaded")
        if self._engines != frozenset(engines):
            self._engines = frozenset(engines)
            self._ring = sorted((self._point(f"{e}#{v}".encode()), e) for e in engines for v in range(self.vnodes))
        i = bisect.bisect(self._ring, (self._point(block_hashes[0]), "")) % len(self._ring)
        return RouteDecision(self._ring[i][1], 0, "hash")


class SGLangApprox(_NoFeedback):
    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs: int = 64,
        balance_rel: float = 1.5,
        max_tree_blocks: int = 2048,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.max_tree_blocks = max_tree_blocks
        self.trees: dict[str, OrderedDict[BlockHash, None]] = {}
        self.owners: dict[BlockHash, set[str]] = {}

    def _match(self, block_hashes: Sequence[BlockHash], engines: Sequence[str]) -> tuple[int, set[str]]:
        # Chained hashes: a tree path is a run of leading hashes, so walking the hashes narrows the engines.
        candidates, depth = set(engines), 0
        for h in block_hashes:
            narrowed = candidates & self.owners.get(h, set())
            if not narrowed:
                break
            candidates, depth = narrowed, depth + 1
        return depth, candidates

    def _insert(self, engine: str, block_hashes: Sequence[BlockHash]) -> None:
        tree = self.trees.setdefault(engine, OrderedDict())
        for h in block_hashes:
            tree[h] = None
            tree.move_to_end(h)
            self.owners.setdefault(h, set()).add(engine)
        while len(tree) > self.max_tree_blocks:
            victim, _ = tree.popitem(last=False)
            owners = self.owners[victim]
            owners.discard(engine)
            if not owners:
                del self.owners[victim]

    def choose(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float
    ) -> RouteDecision:
        engines = _healthy(loads)
        active = [loads[e].active for e in engines]
        lo, hi = min(active), max(active)
        if hi - lo > self.balance_abs and hi > self.balance_rel * lo:
            engine, reason = _least_loaded(loads, engines), "imbalance"
            depth = 0
        else:
            depth, matched = self._match(block_hashes, engines)
            if block_hashes and depth / len(block_hashes) > self.cache_threshold:
                engine, reason = _least_loaded(loads, sorted(matched)), "prefix"
            else:
                engine = min(engines, key=lambda e: (len(self.trees.get(e, ())), loads[e].active))
                reason, depth = "smallest_tree", 0
        self._insert(engine, block_hashes)
        return RouteDecision(engine, depth, reason)


def event_fed(weights: RouteWeights) -> tuple[Router, EventSink]:
    """The router under test and where the engines' event batches go (in process, no NATS)."""
    index = BlockIndex()
    router = CacheAwareRouter(index, weights, block_size=BLOCK_SIZE, has_events=lambda engine_id: True)

    def sink(batch: KVEventBatch, now: float) -> None:
        index.apply(batch.engine_id, batch, now=now)

    return router, sink


def routed_only(weights: RouteWeights) -> tuple[Router, None]:
    """The same router with no events: it remembers the hashes it routed (its fallback), like SGLang's tree."""
    return CacheAwareRouter(BlockIndex(), weights, block_size=BLOCK_SIZE), None


POLICIES: dict[str, Callable[[RouteWeights, int], tuple[Router, EventSink | None]]] = {
    "round-robin": lambda w, cap: (RoundRobin(), None),
    "least-loaded": lambda w, cap: (LeastLoaded(), None),
    "consistent-hash": lambda w, cap: (ConsistentHash(), None),
    "sglang-approx": lambda w, cap: (SGLangApprox(max_tree_blocks=cap), None),
    "routed-only": lambda w, cap: routed_only(w),
    "event-fed": lambda w, cap: event_fed(w),
}
