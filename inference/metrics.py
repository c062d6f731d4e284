"""Prometheus metrics of one engine, named like vLLM's so existing dashboards and alerts apply.

Engine state (cache counters, pool occupancy, queue lengths) is read when scraped, from
the engine's stats() snapshot (inference.stats), rather than mirrored, so it cannot drift.
The engine server gives each EngineMetrics a registry of its own, so several engines (in
tests, or replicas in one process) never clash; the gateway registers it in its app's one
registry instead, beside its own and billing's metrics. `_created` series are not rendered
(kvgate.metrics_text).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from inference.stats import EngineStats
from inference.types import RequestOutput
from kvgate.metrics_text import render_text

# vLLM's TTFT buckets, so histograms from both can be compared bucket for bucket.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip

# vLLM's label values for why a request finished.
_FINISHED_REASON = {"stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}


class StatsSource(Protocol):
    """An engine as its metrics see it (AsyncEngine; the gateway's engine clients)."""

    @property
    def model_id(self) -> str: ...

    def stats(self) -> EngineStats | None:
        """A snapshot of the engine's counters; None while it is not running (or has none)."""
        ...


class EngineMetrics:
    """The engine's metrics; record() each finished request, render() for /metrics.

    They are registered in `registry` (the gateway's), or in a registry of their own.
    """

    def __init__(self, engine: StatsSource, *, registry: CollectorRegistry | None = None) -> None:
        self.engine = engine
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        labels = ["model_name"]
        # Unregistered: collect() yields them after the engine's own state.
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=None,
        )
        self._finished = Counter(
            "vllm:request_success",
            "Finished requests, by why they finished.",
            [*labels, "finished_reason"],
            registry=None,
        )
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of finished requests.", labels, registry=None
        )
        self._generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens of finished requests.", labels, registry=None
        )
        self.registry.register(self)

    def record(self, output: RequestOutput) -> None:
        model = self.engine.model_id
        reason = _FINISHED_REASON.get(output.finish_reason, output.finish_reason)
        self._finished.labels(model, reason).inc()
        self._prompt_tokens.labels(model).inc(output.usage.prompt_tokens)
        self._generation_tokens.labels(model).inc(output.usage.completion_tokens)
        if output.ttft_s is not None:
            self._ttft.labels(model).observe(output.ttft_s)

    def render(self) -> tuple[bytes, str]:
        return render_text(self.registry)

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats()
        if stats is not None:
            yield from _engine_state(stats)
        for metric in (self._ttft, self._finished, self._prompt_tokens, self._generation_tokens):
            yield from metric.collect()


def _engine_state(stats: EngineStats) -> Iterator[Metric]:
    model = stats.model_id

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([model], value)
        return family

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([model], value)
        return family

    used, total = stats.blocks_used, stats.blocks_total
    yield counter(
        "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_cache_queries
    )
    yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits)
    yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", stats.kv_cache_usage)
    yield gauge("kvgate:kv_blocks_used", "KV blocks held by running requests.", used)
    yield gauge("kvgate:kv_blocks_free", "KV blocks free, cached or empty.", total - used)
    yield gauge("kvgate:kv_blocks_total", "KV blocks in the device pool.", total)
    yield counter("kvgate:kv_evictions", "Cached blocks evicted for reuse.", stats.evictions)
    yield counter("vllm:num_preemptions", "Requests preempted to free KV blocks.", stats.preemptions)
    yield gauge("vllm:num_requests_running", "Requests decoding or prefilling.", stats.running)
    yield gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.", stats.waiting)
    events = stats.kv_events
    if events is not None:
        yield counter("kvgate:kv_event_batches", "KV event batches made (the last seq).", events.batches)
        yield counter("kvgate:kv_event_batches_published", "KV event batches published to NATS.", events.published)
        yield counter(
            "kvgate:kv_event_batches_dropped",
            "KV event batches dropped (NATS down or slow): routers see a gap and resync.",
            events.dropped,
        )
        yield gauge("kvgate:kv_event_live_blocks", "Blocks the published KV events say are live.", events.live_blocks)
    yield from _tier_metrics(stats)
    if stats.kernel_plan is not None:
        plan = InfoMetricFamily(
            "kvgate:kernel_plan", "Which kernels this engine runs (inference/platform.py).", labels=["model_name"]
        )
        plan.add_metric([model], stats.kernel_plan)
        yield plan


# Per-tier counters: (metric name, TierStats field, help).
_TIER_COUNTERS = (
    ("kvgate:kv_tier_stores", "stores", "Blocks stored into a KV tier below the device."),
    ("kvgate:kv_tier_loads", "loads", "Blocks loaded from a KV tier into the device (promotions)."),
    ("kvgate:kv_tier_evictions", "evictions", "Blocks that left a KV tier for space or expiry."),
    ("kvgate:kv_tier_demotions", "demotions", "Evicted blocks written to the tier below."),
    ("kvgate:kv_tier_bytes_written", "bytes_written", "Bytes copied into a KV tier."),
    ("kvgate:kv_tier_bytes_read", "bytes_read", "Bytes copied out of a KV tier into the device."),
    ("kvgate:kv_tier_checksum_failures", "checksum_failures", "Stored blocks that failed verification (misses)."),
    ("kvgate:kv_tier_dropped_stores", "dropped_stores", "Blocks a KV tier could not store."),
    ("kvgate:kv_tier_errors", "errors", "Calls to a remote KV tier that failed (treated as misses)."),
    ("kvgate:kv_tier_skipped", "skipped", "Calls to a remote KV tier skipped while its circuit breaker was open."),
)


def _tier_metrics(stats: EngineStats) -> Iterator[Metric]:
    """Hits per tier (device included, in tokens), and each lower tier's traffic and occupancy."""
    hits = CounterMetricFamily(
        "kvgate:kv_tier_hit_tokens", "Prompt tokens read from the cache, by the tier they were found in.",
        labels=["model_name", "tier"],
    )  # fmt: skip
    model = stats.model_id
    for tier_name, tokens in stats.hit_tokens_by_tier.items():
        hits.add_metric([model, tier_name], tokens)
    yield hits
    for name, field, doc in _TIER_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=["model_name", "tier"])
        for tier in stats.tiers:
            family.add_metric([model, tier.name], getattr(tier.counters, field))
        yield family
    used = GaugeMetricFamily("kvgate:kv_tier_blocks_used", "Blocks held by a KV tier.", labels=["model_name", "tier"])
    total = GaugeMetricFamily("kvgate:kv_tier_blocks_total", "Capacity of a KV tier.", labels=["model_name", "tier"])
    used_bytes = GaugeMetricFamily(
        "kvgate:kv_tier_bytes_used", "Bytes of KV held by a KV tier.", labels=["model_name", "tier"]
    )
    for tier in stats.tiers:
        used.add_metric([model, tier.name], tier.blocks_used)
        total.add_metric([model, tier.name], tier.blocks_total)
        used_bytes.add_metric([model, tier.name], tier.bytes_used)
    yield from (used, total, used_bytes)
    if stats.offload_pending is not None:
        pending = GaugeMetricFamily(
            "kvgate:kv_offload_pending",
            "Blocks queued for a KV tier (the disk's and Redis's writers).",
            labels=["model_name"],
        )
        pending.add_metric([model], stats.offload_pending)
        yield pending
