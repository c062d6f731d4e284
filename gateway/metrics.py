"""Prometheus metrics of the gateway: requests by route and status, latency, and the tokens it billed.

One registry per app (per GatewayMetrics, built in the app's lifespan) holds everything
/metrics serves: the gateway's own counters; the engine's (vLLM-named: prefix-cache queries
and hits, pool occupancy, queues, TTFT, tiers), which inference.metrics reads from the engine
client's stats() snapshot and the outputs of finished requests; and the billing hooks'
collector when they have one (billing's counters, spend and savings; see
gateway.billing_hooks). Nothing goes to prometheus_client's process-wide default registry, so
apps built side by side in one process (tests) count apart. `_created` series are not
rendered (kvgate.metrics_text).

Labels are bounded: routes are the app's full route templates, never raw paths, and no
gateway label names a tenant or a key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute

from gateway.api.route_templates import RouteTemplates
from inference.metrics import EngineMetrics
from kvgate.metrics_text import render_text

if TYPE_CHECKING:
    from gateway.backends.base import EngineClient
    from inference.types import RequestOutput
    from kvgate.usage import TokenCounts

# Seconds; from a cache-hit answer of a few tokens to a long cold prefill.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GatewayMetrics:
    """observe_request() for every HTTP request, observe_usage() for every usage record; render() for /metrics.

    `routes` gives each request's route its full template (route_label); `collectors` (billing's)
    are registered in the same registry and rendered with the rest.
    """

    def __init__(
        self,
        engine: EngineClient,
        *,
        routes: RouteTemplates | None = None,
        collectors: Iterable[Collector] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.routes = routes or RouteTemplates(())
        # Given by the app when something built before these metrics (the engine pool's router) shares it.
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
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
        self.engine_metrics = EngineMetrics(engine, registry=self.registry)
        for collector in collectors:
            self.registry.register(collector)

    def route_label(self, route: BaseRoute | None, path: str) -> str:
        """The `route` label of a request to `path` that `route` served (None: no route matched)."""
        return self.routes.label(route, path)

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
        return render_text(self.registry)
