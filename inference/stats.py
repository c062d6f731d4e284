"""A snapshot of one engine's counters and gauges, taken when metrics are read.

Like vLLM's make_prefix_cache_stats/SchedulerStats: whoever renders metrics (the engine
server, the gateway through its engine client) reads an EngineStats instead of reaching
into the engine's pool, scheduler and tiers. Counters are totals since the engine started.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    # Only for annotations: importing the engine or its tiers loads torch, and metrics readers need not.
    from inference.engine import Engine
    from inference.tiers.stats import TierStats

T = TypeVar("T")


@dataclass(frozen=True)
class TierSnapshot:
    """One KV tier below the device: its traffic counters and occupancy."""

    name: str
    counters: TierStats
    blocks_used: int
    blocks_total: int
    bytes_used: int


@dataclass(frozen=True)
class KVEventCounts:
    """KV event publishing (docs/architecture.md, "KV events"): batches made, sent to NATS, dropped."""

    batches: int  # the last seq
    published: int
    dropped: int  # NATS down, a publish failed, or the queue overflowed: routers see a gap
    live_blocks: int  # blocks the published events say are live, over all media


@dataclass(frozen=True)
class EngineStats:
    model_id: str
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found (on the device or in a tier)
    hit_tokens_by_tier: dict[str, int]  # the hits by the tier they came from, device included
    blocks_used: int  # device blocks held by running requests
    blocks_total: int
    evictions: int  # cached device blocks evicted for reuse
    preemptions: int
    running: int
    waiting: int
    tiers: tuple[TierSnapshot, ...]
    offload_pending: int | None  # blocks queued for the disk tier; None without one
    kv_events: KVEventCounts | None = None  # None when the engine publishes no KV events
    kernel_plan: dict[str, str] | None = None  # the engine's KernelPlan as labels (inference/platform.py)

    @property
    def kv_cache_usage(self) -> float:
        return self.blocks_used / self.blocks_total


def _read(getter: Callable[[], T]) -> T:
    """A value the engine thread may be changing: retry the rare read that races a dict resize."""
    for _ in range(3):
        try:
            return getter()
        except RuntimeError:
            continue
    return getter()


def make_engine_stats(core: Engine) -> EngineStats:
    """Read the engine's counters (from any thread: each is one attribute or a small copy)."""
    pool = core.pool
    tiers = core.tiers.tiers if core.tiers is not None else []
    return EngineStats(
        model_id=core.model_id,
        prefix_cache_queries=core.kv.num_query_tokens,
        prefix_cache_hits=core.kv.num_hit_tokens,
        hit_tokens_by_tier=_read(lambda: dict(core.kv.num_hit_tokens_by_tier)),
        blocks_used=_read(lambda: pool.num_used),
        blocks_total=pool.num_blocks,
        evictions=pool.num_evictions,
        preemptions=core.scheduler.num_preemptions,
        running=core.num_running,
        waiting=core.num_waiting,
        tiers=tuple(_tier_snapshot(tier) for tier in tiers),
        offload_pending=core.tiers.num_pending_stores if core.tiers is not None else None,
        kv_events=_kv_event_counts(core),
        kernel_plan=core.plan.labels(),
    )


def _kv_event_counts(core: Engine) -> KVEventCounts | None:
    log, publisher = core.kv_events, core.kv_event_publisher
    if log is None:
        return None
    published, dropped = (publisher.published, publisher.dropped) if publisher is not None else (0, 0)
    return KVEventCounts(batches=log.seq, published=published, dropped=dropped, live_blocks=len(log))


def _tier_snapshot(tier: Any) -> TierSnapshot:
    used = len(tier)
    return TierSnapshot(
        name=tier.name,
        counters=replace(tier.stats),
        blocks_used=used,
        blocks_total=tier.capacity,
        bytes_used=used * tier.layout.nbytes,
    )
