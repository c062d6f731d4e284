"""PLACEHOLDER until gateway/routing/index.py and cache_aware.py land (branch i16-router): delete then.

A minimal event-fed index and cost-function router after the issue's text, so the simulator
runs before the real ones exist. bench/route_sim_policies.py uses the real ones when present.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.routing.types import EngineLoad, PrefixMatch, RouteDecision
from inference.hashing import BlockHash
from kvgate.kv_events import DEVICE_MEDIA, LOWER_MEDIA, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


class BlockIndex:
    def __init__(self) -> None:
        self.blocks: dict[BlockHash, dict[str, dict[str, float]]] = {}  # hash -> engine -> medium -> expires_at

    def apply(self, batch: KVEventBatch) -> None:
        engine = batch.engine_id
        for event in batch.events:
            if isinstance(event, BlockStored):
                for h in event.block_hashes:
                    self.blocks.setdefault(h, {}).setdefault(engine, {})[event.medium or "GPU"] = (
                        event.expires_at or float("inf")
                    )
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    media = self.blocks.get(h, {}).get(engine)
                    if media is not None:
                        media.pop(event.medium or "GPU", None)
                        if not media:
                            del self.blocks[h][engine]
            elif isinstance(event, AllBlocksCleared):
                for engines in self.blocks.values():
                    engines.pop(engine, None)

    def match(self, hashes: Sequence[BlockHash], engines: Sequence[str], now: float) -> dict[str, PrefixMatch]:
        out = {}
        for engine in engines:
            g = h = 0
            for bh in hashes:
                media = self.blocks.get(bh, {}).get(engine, {})
                if any(m in DEVICE_MEDIA and at > now for m, at in media.items()) and h == 0:
                    g += 1
                elif any(m in LOWER_MEDIA and at > now for m, at in media.items()):
                    h += 1
                else:
                    break
            out[engine] = PrefixMatch(g, h, 0)
        return out


class CacheAwareRouter:
    def __init__(
        self,
        index: BlockIndex,
        *,
        alpha: float,
        beta: float,
        w_load: float,
        w_queue: float,
        min_match_blocks: int,
        imbalance_ratio: float,
    ) -> None:
        self.index = index
        self.alpha, self.beta, self.w_load, self.w_queue = alpha, beta, w_load, w_queue
        self.min_match_blocks, self.imbalance_ratio = min_match_blocks, imbalance_ratio

    def choose(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float
    ) -> RouteDecision:
        healthy = [e for e, load in loads.items() if load.healthy]
        matches = self.index.match(block_hashes, healthy, now)
        best = max((m.total for m in matches.values()), default=0)
        n = len(block_hashes)

        def cost(e: str) -> float:
            m = matches[e] if best >= self.min_match_blocks else PrefixMatch(0, 0, 0)
            load = loads[e]
            return (
                n
                - m.device
                - self.alpha * m.lower
                - self.beta * m.shared
                + self.w_load * load.active
                + self.w_queue * load.queued_prefill_tokens
            )

        engine = min(healthy, key=cost)
        mean = sum(loads[e].active for e in healthy) / len(healthy)
        if loads[engine].active > self.imbalance_ratio * mean + 1:
            engine = min(healthy, key=lambda e: (loads[e].active, loads[e].queued_prefill_tokens))
            return RouteDecision(engine, matches[engine].total, "imbalance")
        return RouteDecision(engine, matches[engine].total, "prefix" if matches[engine].total else "least_loaded")

    def record_actual(self, decision: RouteDecision, actual_hit_blocks: int) -> None:
        pass
