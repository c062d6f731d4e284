"""The cache-aware router: send a request where its prefix already sits, unless that engine is too busy.

Per healthy engine, in blocks of prefill work (lowest wins):

    cost = B − g − α·h − β·r + w_load·active + w_queue·queued_prefill_tokens

B is the request's full blocks; g, h and r its leading blocks the engine holds on its device, in
its host or disk tiers, and can read from the shared tier (BlockIndex.match). α and β below 1 say
that loading a block costs something, less than computing it. w_load prices a request in flight
there in blocks; w_queue prices a queued prefill token. Their defaults (8 and 0) are what
bench/route_sim.py --tune chose on the multi-turn and burst workloads: in-flight requests alone
price load, and 8 blocks each kept p99 imbalance within 1.2x of round-robin's.

Three rules keep prefix affinity from piling everything on one engine:
- imbalance: when the busiest engine has more than `imbalance_abs` requests in flight above the
  least busy AND more than `imbalance_rel` times as many, the least loaded engine gets the request
  (SGLang's cache_aware policy does the same, by default at 32 and 1.0001 for GPU servers;
  kvgate's CPU engines batch fewer requests, so 16, and 1.5 so that two busy engines a few
  requests apart do not count as imbalanced);
- minimum match: an engine's match shorter than `min_match_blocks` counts as none;
- popular prefixes: a match ending at a block where many recent requests' best matches ended (a
  shared system prompt that sessions then diverge from: `popular_requests` requests within about
  `popular_half_life_s`) is credited at most `popular_spread_load` requests' worth of load
  (w_load each): its holders share those requests by load, and once every holder is that much
  busier than some other engine, the other engine gets them and the prefix spreads, one replica
  at a time rather than to every engine (0: popular prefixes go by load alone). Among equal costs
  a holder wins. A session's later turns match past the shared part, to their own blocks, and
  stick.

Ties go by a stable hash of the request's first block and the engine: a prefix's requests agree,
different prefixes spread. Without events for an engine (no NATS, a vLLM engine), the router
inserts the hashes it routed there with the request's TTL (BlockIndex.insert_routed), so a
session's next turn follows. With events it inserts them for `pending_s` only: the time until the
engine's own BlockStored arrive, so that a burst of one new prefix stays together.

Pure: no I/O; the caller passes `now`, wall-clock epoch seconds (time.time(), the clock of the
events' expiries; a monotonic clock would make event-fed entries outlive their expiry).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.routing.index import BlockIndex
from gateway.routing.types import EngineLoad, PrefixMatch, RouteDecision
from inference.hashing import BlockHash

if TYPE_CHECKING:
    from gateway.routing.metrics import RoutingMetrics
    from gateway.settings import GatewaySettings


class NoHealthyEngine(LookupError):
    """No engine in `loads` is healthy (a LookupError, as the least-loaded router raises): the caller
    answers 503/529, it does not retry here."""


@dataclass(frozen=True)
class RouteWeights:
    """The cost function's weights and the anti-pinning rules' thresholds (GatewaySettings route_*)."""

    alpha: float = 0.8  # credit per block in a host or disk tier (loading beats recomputing)
    beta: float = 0.6  # credit per block in the shared tier (a network round trip per chunk)
    w_load: float = 8.0  # blocks of cost per request in flight on the engine (tuned by bench/route_sim.py)
    w_queue: float = 0.0  # blocks of cost per queued prefill token (tuned: 0; 1/16 would be a block per block ahead)
    min_match_blocks: int = 2  # shorter matches count as none
    imbalance_abs: int = 16  # busiest − least busy above this ...
    imbalance_rel: float = 1.5  # ... and busiest above this × least busy: send to the least busy
    popular_requests: float = 8.0  # requests whose best match ended at one block within ~half-life
    popular_half_life_s: float = 30.0
    popular_spread_load: float = 4.0  # a popular prefix's credit, in requests in flight
    pending_s: float = 10.0  # event-fed engines: a routed prefix is assumed there until its events arrive

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> RouteWeights:
        return cls(
            alpha=settings.route_alpha,
            beta=settings.route_beta,
            w_load=settings.route_w_load,
            w_queue=settings.route_w_queue,
            min_match_blocks=settings.route_min_match_blocks,
            imbalance_abs=settings.route_imbalance_abs,
            imbalance_rel=settings.route_imbalance_rel,
            popular_requests=settings.route_popular_requests,
            popular_half_life_s=settings.route_popular_half_life_s,
            popular_spread_load=settings.route_popular_spread_load,
            pending_s=settings.route_pending_s,
        )


def _never(engine_id: str) -> bool:
    return False


class CacheAwareRouter:
    """gateway.routing.types.Router over a BlockIndex.

    `has_events(engine_id)`: whether that engine's events reach the index (the event consumer's
    `covers`); engines without get fallback insertions. `shared_readers`: engines with the shared
    tier (None: all). `block_size` turns blocks into the metrics' tokens. `engine_weights` (the pool's,
    read at each call; missing engines weigh 1): an engine of weight 2 counts half its load, in the cost
    and in the imbalance rule.
    """

    def __init__(
        self,
        index: BlockIndex | None = None,
        weights: RouteWeights | None = None,
        *,
        block_size: int = 16,
        has_events: Callable[[str], bool] = _never,
        shared_readers: Collection[str] | None = None,
        metrics: RoutingMetrics | None = None,
        engine_weights: Mapping[str, float] | None = None,
        max_tracked_prefixes: int = 4096,
    ) -> None:
        self.engine_weights = engine_weights if engine_weights is not None else {}
        self.index = index if index is not None else BlockIndex()
        self.weights = weights or RouteWeights()
        self.block_size = block_size
        self.has_events = has_events
        self.shared_readers = shared_readers
        self.metrics = metrics
        if metrics is not None:
            metrics.watch_index(self.index.__len__)
        # block hash -> (decayed count of requests whose best match ended there, when last updated)
        self._match_ends: OrderedDict[BlockHash, tuple[float, float]] = OrderedDict()
        self._max_tracked = max_tracked_prefixes
        self._unkeyed = 0  # spreads requests without a full block

    def choose(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float
    ) -> RouteDecision:
        healthy = [engine_id for engine_id, load in loads.items() if load.healthy]
        if not healthy:
            raise NoHealthyEngine("no healthy engine to route to")
        matches = self.index.match(block_hashes, healthy, now=now, shared_readers=self.shared_readers)
        decision = self._decide(block_hashes, healthy, loads, matches, now)
        if not self.has_events(decision.engine):
            self.index.insert_routed(decision.engine, block_hashes, ttl_s, now=now)
        elif self.weights.pending_s > 0:
            # Until the engine's own events say so (after its prefill), a burst of requests with this new
            # prefix would otherwise scatter; the events, a removal or a resync then overrule the guess.
            self.index.insert_routed(decision.engine, block_hashes, min(ttl_s, self.weights.pending_s), now=now)
        if self.metrics is not None:
            self.metrics.decisions.labels(decision.engine, decision.reason).inc()
        return decision

    def record_actual(self, decision: RouteDecision, actual_hit_blocks: int) -> None:
        if self.metrics is not None:
            self.metrics.predicted_hit_tokens.labels(decision.engine).inc(
                decision.predicted_hit_blocks * self.block_size
            )
            self.metrics.actual_hit_tokens.labels(decision.engine).inc(actual_hit_blocks * self.block_size)

    def costs(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, now: float
    ) -> dict[str, float]:
        """Each healthy engine's cost as choose() would weigh it (for tests, the simulator, debugging);
        changes nothing."""
        healthy = [engine_id for engine_id, load in loads.items() if load.healthy]
        matches = self.index.match(block_hashes, healthy, now=now, shared_readers=self.shared_readers)
        popular = self._popular(block_hashes, matches, now, count=False)
        return {e: self._cost(len(block_hashes), matches[e], popular, e, loads[e]) for e in healthy}

    # -- the decision -------------------------------------------------------------------------------

    def _decide(
        self,
        block_hashes: Sequence[BlockHash],
        healthy: list[str],
        loads: Mapping[str, EngineLoad],
        matches: dict[str, PrefixMatch],
        now: float,
    ) -> RouteDecision:
        key = self._tie_key(block_hashes)
        if len(healthy) == 1:
            engine_id = healthy[0]
            return RouteDecision(engine_id, matches[engine_id].total, "single")
        popular = self._popular(block_hashes, matches, now, count=True)
        if self._imbalanced({e: loads[e] for e in healthy}):
            engine_id = min(
                healthy,
                key=lambda e: (loads[e].active / self._weight(e), loads[e].queued_prefill_tokens, _tie(key, e)),
            )
            return RouteDecision(engine_id, matches[engine_id].total, "imbalance")
        B = len(block_hashes)
        engine_id = min(
            healthy,
            key=lambda e: (
                self._cost(B, matches[e], popular, e, loads[e]),
                -matches[e].total,
                _tie(key, e),
            ),
        )
        chosen = matches[engine_id]
        if self._credit(chosen, popular) == 0:
            reason = "least_loaded"
        elif popular:
            reason = "popular"
        else:
            reason = "prefix"
        return RouteDecision(engine_id, chosen.total, reason)

    def _weight(self, engine_id: str) -> float:
        weight = self.engine_weights.get(engine_id, 1.0)
        return weight if weight > 0 else 1.0

    def _cost(self, blocks: int, match: PrefixMatch, popular: bool, engine_id: str, load: EngineLoad) -> float:
        w = self.weights
        busy = (w.w_load * load.active + w.w_queue * load.queued_prefill_tokens) / self._weight(engine_id)
        return blocks - self._credit(match, popular) + busy

    def _credit(self, match: PrefixMatch, popular: bool) -> float:
        """What a match takes off the cost: g + α·h + β·r; none when shorter than the minimum, and at most
        popular_spread_load requests' worth when the prefix is popular."""
        w = self.weights
        if match.total < w.min_match_blocks:
            return 0.0
        credit = match.device + w.alpha * match.lower + w.beta * match.shared
        return min(credit, w.w_load * w.popular_spread_load) if popular else credit

    def _imbalanced(self, loads: dict[str, EngineLoad]) -> bool:
        busiest = max(load.active / self._weight(e) for e, load in loads.items())
        least = min(load.active / self._weight(e) for e, load in loads.items())
        w = self.weights
        return busiest - least > w.imbalance_abs and busiest > w.imbalance_rel * least

    def _popular(
        self, block_hashes: Sequence[BlockHash], matches: dict[str, PrefixMatch], now: float, *, count: bool
    ) -> bool:
        """Whether the best match ends at a block where many recent requests' best matches ended; with
        `count`, this request is counted there too."""
        deepest = max((m.total for m in matches.values()), default=0)
        if deepest == 0:
            return False
        end = block_hashes[deepest - 1]
        score, then = self._match_ends.get(end, (0.0, now))
        half_life = self.weights.popular_half_life_s
        if half_life > 0 and now > then:
            score *= math.exp2(-(now - then) / half_life)
        if count:
            score += 1.0
            self._match_ends[end] = (score, now)
            self._match_ends.move_to_end(end)
            while len(self._match_ends) > self._max_tracked:
                self._match_ends.popitem(last=False)
        # This request itself is not evidence of popularity: the threshold counts the others.
        return score - (1.0 if count else 0.0) >= self.weights.popular_requests

    def _tie_key(self, block_hashes: Sequence[BlockHash]) -> bytes:
        if block_hashes:
            return block_hashes[0]
        self._unkeyed += 1
        return self._unkeyed.to_bytes(8, "little")


def _tie(key: bytes, engine_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + engine_id.encode(), digest_size=8).digest(), "little")
