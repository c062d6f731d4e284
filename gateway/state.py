"""Everything a request handler needs, built once at start-up and kept on app.state.gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.admin_attempts import AdminAttempts
from gateway.auth_cache import PrincipalCache
from gateway.auth_invalidation import AuthInvalidation, Eviction
from gateway.backends.base import EngineClient
from gateway.billing_hooks import BillingHooks
from gateway.cache_block_index import CacheBlockIndex
from gateway.cache_fingerprint_store import FingerprintStore
from gateway.inflight import InflightJournal
from gateway.metrics import GatewayMetrics
from gateway.prompt import PromptRenderer
from gateway.ratelimit import Limits, RateLimiter
from gateway.services.keys import Principal
from gateway.services.server_state import AdminTokenVerifier
from gateway.settings import GatewaySettings
from gateway.usage import UsageRecorder
from kvgate.db_health import DatabaseHealth

if TYPE_CHECKING:
    from gateway.cache_probe import EngineCacheFacts
    from gateway.request_workers import RequestWorkers
    from gateway.services.completions import PrepareContext


@dataclass
class Gateway:
    settings: GatewaySettings
    engine: EngineClient
    renderer: PromptRenderer
    sessions: async_sessionmaker[AsyncSession]
    limiter: RateLimiter
    recorder: UsageRecorder
    billing: BillingHooks
    secret: str
    admin: AdminTokenVerifier
    auth_cache: PrincipalCache
    metrics: GatewayMetrics
    prep: PrepareContext
    workers: RequestWorkers
    db_health: DatabaseHealth = field(default_factory=DatabaseHealth)
    # Wrong admin tokens, by client address (/admin/v1 and /login).
    admin_attempts: AdminAttempts = field(default_factory=AdminAttempts)
    # Admitted requests not yet recorded, on disk (None when KVGATE_INFLIGHT_JOURNAL is off).
    journal: InflightJournal | None = None
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    # Prompt fingerprints for cache diagnostics (gateway/cache_fingerprint_store.py); set by the lifespan.
    fingerprints: FingerprintStore = field(default_factory=FingerprintStore)
    # Each tenant's recent prompt blocks, to explain cache misses (gateway/cache_block_index.py).
    cache_index: CacheBlockIndex = field(default_factory=CacheBlockIndex)
    cache_facts: EngineCacheFacts | None = None  # the engine's block size, clock and tiers, read once
    # Shares auth-cache evictions with the other gateways (KVGATE_REDIS_URL); None: this process only.
    auth_invalidation: AuthInvalidation | None = None
    # Runs stored batches' items (gateway/batches/runner.py BatchRunner); set by the lifespan.
    batch_runner: Any = None

    async def evict_principals(self, *, key_id: str | None = None, tenant_id: str | None = None) -> None:
        """Drop a changed key's (or tenant's) cached principals here and, with Redis, on every gateway."""
        if self.auth_invalidation is None:
            self.auth_cache.evict(key_id=key_id, tenant_id=tenant_id)
        else:
            await self.auth_invalidation.evict(Eviction(key_id=key_id, tenant_id=tenant_id))

    def limits_for(self, principal: Principal) -> Limits:
        return Limits(
            requests_per_minute=principal.requests_per_minute or self.settings.default_requests_per_minute,
            input_tokens_per_minute=principal.input_tokens_per_minute or self.settings.default_input_tokens_per_minute,
        )

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run work that must outlive the request (finishing an abandoned stream)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    async def drain(self) -> None:
        """Wait for background work, including what finishing it spawns (callers bound the wait)."""
        await asyncio.sleep(0)  # requests cancelled just now spawn their settlement on their next turn
        while self.background:
            # asyncio.wait, not gather: a drain cut short by its caller must not cancel the work.
            done, _ = await asyncio.wait(set(self.background))
            for task in done:  # retrieved, as gather would (each logs its own failures)
                if not task.cancelled():
                    task.exception()
