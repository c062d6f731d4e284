"""Prometheus metrics of the gateway: requests by route and status, latency, and the tokens it billed.

The engine's own metrics (vLLM-named: prefix-cache queries and hits, pool occupancy,
queues, TTFT, tiers) are served alongside, from the same scrape: inference.metrics renders
them from the engine client's stats() snapshot and the outputs of finished requests.
Labels are bounded: routes are the app's route templates, never raw paths, and no label
names a tenant or a key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from inference.metrics import EngineMetrics

if TYPE_CHECKING:
    from gateway.backends.base import EngineClient
    from inference.types import RequestOutput
    from kvgate.usage import TokenCounts

# Seconds; from a cache-hit answer of a few tokens to a long cold prefill.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GatewayMetrics:
    """observe_request() for every HTTP request, observe_usage() for every usage record; render() for /metrics."""

    def __init__(self, engine: EngineClient) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._requests = Counter(
            "kvgate:gateway_requests", "HTTP requests, by route and status code.", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self._duration = Histogram(
            "kvgate:gateway_request_duration_seconds", "Time from a request's arrival to its last byte, by route.",
            ["route"], buckets=DURATION_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self._tokens = Counter(
            "kvgate:gateway_tokens",
            "Tokens of usage records, by model and billing category (input, cache_write_5m, cache_write_30m, "
            "cache_write_1h, cache_write_12h, cache_write_24h, cache_read, output).",
            ["model", "category"],
            registry=self.registry,
        )
        self._records = Counter(
            "kvgate:gateway_usage_records", "Usage records, by model and status.", ["model", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.engine_metrics = EngineMetrics(engine)

    def observe_request(self, *, route: str, status: int, seconds: float) -> None:
        self._requests.labels(route, str(status)).inc()
        self._duration.labels(route).observe(seconds)

    def observe_usage(
        self, *, model: str, status: str, counts: TokenCounts, output: RequestOutput | None = None
    ) -> None:
        """One usage record; `output` is None for one recovered after a crash (the engine never finished it)."""
        for category, n in counts.by_category().items():
            self._tokens.labels(model, category.value).inc(n)
        self._records.labels(model, status).inc()
        if output is not None:
            self.engine_metrics.record(output)

    def render(self) -> tuple[bytes, str]:
        body = generate_latest(self.registry) + self.engine_metrics.render()[0]
        return body, CONTENT_TYPE_LATEST
