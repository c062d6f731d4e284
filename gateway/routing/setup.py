"""Builds one gateway process's router from its settings: the index, the router, its metrics, and the event
consumer when KVGATE_NATS_URL is set (the engine pool's wiring calls this once, in the app's lifespan)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NamedTuple

from prometheus_client import CollectorRegistry

from gateway.routing.cache_aware import CacheAwareRouter, RouteWeights
from gateway.routing.event_consumer import KVEventConsumer
from gateway.routing.index import BlockIndex
from gateway.routing.metrics import RoutingMetrics
from gateway.settings import GatewaySettings


class RoutingStack(NamedTuple):
    router: CacheAwareRouter
    consumer: KVEventConsumer | None  # None without KVGATE_NATS_URL: every engine gets fallback insertions
    metrics: RoutingMetrics


def build_routing(
    settings: GatewaySettings,
    *,
    registry: CollectorRegistry,
    model_id: str,
    block_size: int,
    event_engines: Mapping[str, str],
    shared_readers: Collection[str] | None = None,
    engine_weights: Mapping[str, float] | None = None,
    engine_token: str | None = None,
) -> RoutingStack:
    """`model_id` and `block_size` are the engines' (GET /kv/info); `event_engines` maps the ids of the
    engines that publish KV events to their base URLs, and may be filled in later (then call
    `consumer.resync(engine_id)`). Start the consumer with `await consumer.start()`, stop it with
    `await consumer.close()`."""
    index = BlockIndex(max_entries=settings.route_index_max_entries)
    metrics = RoutingMetrics(registry, index_size=index.__len__)
    consumer = None
    if settings.nats_url:
        consumer = KVEventConsumer(
            index,
            nats_url=settings.nats_url,
            model_id=model_id,
            engines=event_engines,
            metrics=metrics,
            engine_token=engine_token,
        )
    router = CacheAwareRouter(
        index,
        RouteWeights.from_settings(settings),
        block_size=block_size,
        has_events=consumer.covers if consumer is not None else lambda engine_id: False,
        shared_readers=shared_readers,
        metrics=metrics,
        engine_weights=engine_weights,
    )
    return RoutingStack(router, consumer, metrics)
