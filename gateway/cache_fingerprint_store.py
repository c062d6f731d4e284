"""Where fingerprints are kept: per tenant, for KVGATE_CACHE_DIAGNOSTICS_TTL_S, at most so many per tenant.

In this process's memory always: per tenant, least recently used first out when the tenant is at
its cap, and gone when its time is up (a clock the tests control). With KVGATE_REDIS_URL, written
through to Redis as well, so that a request on another gateway finds a response this one served:
one key per fingerprint with the same time to live, and a sorted set per tenant (score: last
use) that bounds the tenant to the same cap. A lookup asks memory first, then Redis.

Redis away (an error, or no answer within the timeout) costs nothing but the sharing: memory
still answers, and one log line marks each outage. Keys are named by tenant and response id; what
they hold is hashes and a token count (gateway.cache_fingerprints), nothing of the prompt.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import structlog

from gateway.cache_fingerprints import Fingerprint

log = structlog.get_logger("kvgate.gateway")

DEFAULT_TTL_S = 3600.0
DEFAULT_PER_TENANT = 10_000
REDIS_PREFIX = "kvgate:fp:"


class FingerprintStore:
    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        per_tenant: int = DEFAULT_PER_TENANT,
        redis_url: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 0.5,
        retry_s: float = 1.0,
        prefix: str = REDIS_PREFIX,
    ) -> None:
        self.ttl_s = ttl_s
        self.per_tenant = per_tenant
        self._clock = clock
        self._memory: dict[str, OrderedDict[str, tuple[float, Fingerprint]]] = {}
        self._prefix = prefix
        self._redis: Any = None
        self._retry_s = retry_s
        self._down_until: float | None = None  # monotonic; None while Redis answers
        if redis_url:
            from redis.asyncio import Redis

            self._redis = Redis.from_url(redis_url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)

    async def aclose(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    # -- memory -----------------------------------------------------------------------------------

    def _remember(self, tenant_id: str, response_id: str, fingerprint: Fingerprint, ttl_s: float) -> None:
        entries = self._memory.setdefault(tenant_id, OrderedDict())
        entries[response_id] = (self._clock() + ttl_s, fingerprint)
        entries.move_to_end(response_id)
        while len(entries) > self.per_tenant:
            entries.popitem(last=False)

    def _recall(self, tenant_id: str, response_id: str) -> Fingerprint | None:
        entries = self._memory.get(tenant_id)
        found = entries.get(response_id) if entries else None
        if entries is None or found is None:
            return None
        expires_at, fingerprint = found
        if expires_at <= self._clock():
            del entries[response_id]
            if not entries:
                del self._memory[tenant_id]
            return None
        entries.move_to_end(response_id)
        return fingerprint

    # -- Redis ------------------------------------------------------------------------------------

    def _keys(self, tenant_id: str, response_id: str) -> tuple[str, str]:
        return f"{self._prefix}{tenant_id}:{response_id}", f"{self._prefix}{tenant_id}:index"

    def _use_redis(self) -> bool:
        # After a failure Redis is left alone for retry_s: an outage must not cost every request a timeout.
        return self._redis is not None and (self._down_until is None or time.monotonic() >= self._down_until)

    def _away(self, error: Exception) -> None:
        if self._down_until is None:
            log.warning("cache_fingerprints_redis_unavailable", error=str(error), fallback="this process's memory")
        self._down_until = time.monotonic() + self._retry_s

    def _back(self) -> None:
        if self._down_until is not None:
            log.info("cache_fingerprints_redis_back")
        self._down_until = None

    async def _redis_put(self, tenant_id: str, response_id: str, fingerprint: Fingerprint) -> None:
        key, index = self._keys(tenant_id, response_id)
        ttl_ms = max(1, int(self.ttl_s * 1000))
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(key, fingerprint.as_json(), px=ttl_ms)
        pipe.zadd(index, {response_id: now})
        pipe.zremrangebyscore(index, "-inf", now - self.ttl_s)
        pipe.pexpire(index, ttl_ms)
        pipe.zcard(index)
        *_, count = await pipe.execute()
        if count > self.per_tenant:
            evicted = await self._redis.zpopmin(index, count - self.per_tenant)
            names = [name.decode() if isinstance(name, bytes) else name for name, _ in evicted]
            if names:
                await self._redis.delete(*(self._keys(tenant_id, name)[0] for name in names))

    async def _redis_get(self, tenant_id: str, response_id: str) -> tuple[Fingerprint, float] | None:
        """The fingerprint and the seconds it has left."""
        key, index = self._keys(tenant_id, response_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.get(key)
        pipe.pttl(key)
        pipe.zadd(index, {response_id: time.time()}, xx=True)  # a use: last out of the tenant's cap
        value, left_ms, _ = await pipe.execute()
        if value is None or left_ms <= 0:
            return None
        return Fingerprint.from_json(value), left_ms / 1000

    # -- the store --------------------------------------------------------------------------------

    async def put(self, tenant_id: str, response_id: str, fingerprint: Fingerprint) -> None:
        self._remember(tenant_id, response_id, fingerprint, self.ttl_s)
        if not self._use_redis():
            return
        try:
            await self._redis_put(tenant_id, response_id, fingerprint)
        except Exception as error:  # redis' ConnectionError and TimeoutError, OSError: all mean "away"
            self._away(error)
        else:
            self._back()

    async def get(self, tenant_id: str, response_id: str) -> Fingerprint | None:
        """The tenant's fingerprint of that response, if it is still kept (another tenant's id: None)."""
        found = self._recall(tenant_id, response_id)
        if found is not None or not self._use_redis():
            return found
        try:
            shared = await self._redis_get(tenant_id, response_id)
        except Exception as error:
            self._away(error)
            return None
        self._back()
        if shared is None:
            return None
        fingerprint, left_s = shared
        self._remember(tenant_id, response_id, fingerprint, left_s)  # kept here no longer than there
        return fingerprint
