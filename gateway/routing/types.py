"""The routing vocabulary shared by the router, the engine pool and the simulator (bench/route_sim.py).

A request is routed by its salted chained block hashes (inference/hashing.py BlockHasher,
computed by the gateway with the engine's model id, block size and hash algorithm, and the
tenant's cache salt): the same hashes the engines publish in their KV events
(kvgate/kv_events.py) and store in the shared tier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from inference.hashing import BlockHash


class EngineLoad(NamedTuple):
    """What a router knows of one engine's load when it routes."""

    active: int  # requests in flight there (sent by this gateway, or reported by the engine)
    queued_prefill_tokens: int  # uncached prompt tokens sent there and not yet prefilled
    healthy: bool = True


class PrefixMatch(NamedTuple):
    """How much of a request's leading blocks one engine holds, by where they sit."""

    device: int  # g: leading blocks in its device pool
    lower: int  # h: the next leading blocks in its host or disk tiers
    shared: int  # r: the next leading blocks in the shared (Redis) tier

    @property
    def total(self) -> int:
        return self.device + self.lower + self.shared


class RouteDecision(NamedTuple):
    engine: str  # the engine's id (its base URL for HTTP engines)
    predicted_hit_blocks: int  # what the router expects the engine to read; billing never uses it
    reason: str  # "prefix", "least_loaded", "imbalance", "fallback", ... (a metrics label)


class Router(Protocol):
    """Chooses an engine for a request; one per gateway process, fed by events or by its own choices."""

    def choose(
        self, block_hashes: Sequence[BlockHash], loads: Mapping[str, EngineLoad], *, ttl_s: int, now: float
    ) -> RouteDecision:
        """Pick among the healthy engines in loads. ttl_s is the request's cache TTL: without events, the
        router remembers the hashes it routed for that long."""
        ...

    def record_actual(self, decision: RouteDecision, actual_hit_blocks: int) -> None:
        """The engine's real count, once known: for the predicted-vs-actual metrics."""
        ...
