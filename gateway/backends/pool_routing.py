"""The engine pool's cache-aware routing: gateway.routing.setup's stack, wired to the pool's engines.

`kvgate serve` with KVGATE_ENGINES a list routes through this (gateway.backends.factory). Once the
pool knows its first engines (their model id, block size and hash algorithm from GET /kv/info), it
calls `build()`: the index, the CacheAwareRouter, the router's metrics on the app's registry
(`attach_metrics`, from the app's lifespan) and, with KVGATE_NATS_URL, the KV event consumer,
started here and closed with the pool (the pool starts and stops in the app's lifespan).

The consumer follows the engines whose /kv/info names a `kv_events_subject` (engine id -> base
URL, `event_engines`); the shared tier counts only for engines whose /kv/info says
`shared_tier` (`shared_readers`). Both are filled in place as engines join the pool, and a
newly joined engine that publishes events is resynced from its /kv/snapshot at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gateway.routing.setup import RoutingStack, build_routing
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.backends.engine_health import Member
    from gateway.routing.types import Router


class PoolRouting:
    """What an EnginePool calls: build() once, engine_joined() per engine described, close() at shutdown."""

    def __init__(self, settings: GatewaySettings, *, engine_token: str | None = None) -> None:
        self.settings = settings
        self.engine_token = engine_token  # for the consumer's GET /kv/snapshot
        self.registry: CollectorRegistry | None = None
        self.event_engines: dict[str, str] = {}  # engine id -> base URL, for the consumer's resyncs
        self.shared_readers: set[str] = set()
        self.stack: RoutingStack | None = None

    def attach_metrics(self, registry: CollectorRegistry) -> None:
        """The app's registry, for the router's metrics (before the pool starts; else they get one of their own)."""
        self.registry = registry

    async def build(
        self, members: list[Member], *, model_id: str, block_size: int, weights: Mapping[str, float]
    ) -> Router:
        """The router over the engines known so far; starts the event consumer when there is one."""
        for member in members:
            if member.known:
                self.engine_joined(member)
        self.stack = build_routing(
            self.settings,
            registry=self.registry if self.registry is not None else CollectorRegistry(auto_describe=False),
            model_id=model_id,
            block_size=block_size,
            event_engines=self.event_engines,
            shared_readers=self.shared_readers,
            engine_weights=weights,
            engine_token=self.engine_token,
        )
        if self.stack.consumer is not None:
            await self.stack.consumer.start()  # connects in the background; resyncs every known engine
        return self.stack.router

    def engine_joined(self, member: Member) -> None:
        """An engine the pool has just described: follow its events, count its shared tier."""
        info = member.engine.info
        if info is None:
            return
        if info.shared_tier:
            self.shared_readers.add(info.engine_id)
        if info.kv_events_subject and self.event_engines.get(info.engine_id) != member.url:
            self.event_engines[info.engine_id] = member.url
            consumer = self.stack.consumer if self.stack is not None else None
            if consumer is not None:
                consumer.resync(info.engine_id)

    async def close(self) -> None:
        if self.stack is not None and self.stack.consumer is not None:
            await self.stack.consumer.close()
