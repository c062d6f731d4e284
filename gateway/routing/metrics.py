"""The router's Prometheus metrics, on the app's own registry (gateway/metrics.py: one per app).

Predicted and actual hit tokens are counted side by side per engine, so a scrape shows how far
the router's index is from what the engines really read: predicted is what the router expected
when it chose (never billed), actual is the engine's own count from the request's usage.
Labels are bounded: engines are the configured pool, reasons a fixed set, outcomes two words.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class RoutingMetrics:
    """Counters the router (decisions, predicted vs actual) and the event consumer (gaps, resyncs,
    bad messages) feed; the index size is read at scrape time from `index_size`."""

    def __init__(self, registry: CollectorRegistry, *, index_size: Callable[[], int] | None = None) -> None:
        self.predicted_hit_tokens = Counter(
            "kvgate:router_predicted_hit_tokens",
            "Prompt tokens the router expected the chosen engine to read from its caches, by engine.",
            ["engine"], registry=registry,
        )  # fmt: skip
        self.actual_hit_tokens = Counter(
            "kvgate:router_actual_hit_tokens",
            "Prompt tokens the chosen engine really read from its caches (its own count), by engine.",
            ["engine"], registry=registry,
        )  # fmt: skip
        self.decisions = Counter(
            "kvgate:router_decisions",
            "Routing decisions, by engine and reason (prefix, least_loaded, imbalance, popular, single).",
            ["engine", "reason"], registry=registry,
        )  # fmt: skip
        self.index_entries = Gauge(
            "kvgate:router_index_entries", "Entries in the router's block index (engine copies and shared blocks).",
            registry=registry,
        )  # fmt: skip
        if index_size is not None:
            self.index_entries.set_function(index_size)
        self.event_gaps = Counter(
            "kvgate:router_event_gaps",
            "KV event batches whose sequence number skipped or went back (a gap or an engine restart), by engine.",
            ["engine"], registry=registry,
        )  # fmt: skip
        self.resyncs = Counter(
            "kvgate:router_resyncs",
            "Resyncs of the index from an engine's /kv/snapshot, by engine and outcome (ok, failed).",
            ["engine", "outcome"], registry=registry,
        )  # fmt: skip
        self.bad_messages = Counter(
            "kvgate:router_bad_event_messages", "KV event messages that could not be decoded and were skipped.",
            registry=registry,
        )  # fmt: skip

    def watch_index(self, index_size: Callable[[], int]) -> None:
        self.index_entries.set_function(index_size)
