"""Recently authenticated API keys: fresh for a couple of seconds, last-known-good for longer.

A fresh entry (younger than KVGATE_AUTH_CACHE_TTL_S, 0 to disable) spares a database
read per request. An older one is only used while the database cannot be reached, and
only until KVGATE_AUTH_STALE_TTL_S after the database last accepted the key (0 to
disable), so a database outage does not lock out the tenants that were just working.

Revoking a key or suspending a tenant through the admin API evicts at once, and a key
the database refuses (401/403) is evicted when it does. With KVGATE_REDIS_URL set, every
such change (admin API or CLI, on any gateway) is published and every gateway evicts at
once (gateway/auth_invalidation.py); while a gateway cannot hear those messages its fresh
TTL is 0 (suspend_freshness), and entries cached before it heard them again are not fresh.
Without Redis, a change made elsewhere takes effect within the fresh TTL. A key's expiry
is checked on every use, cached or not.

Concurrent misses of one key share a single database lookup (load()): under load, a
fresh entry expiring used to send every request in flight to the database at once.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from gateway.services.keys import Principal


class PrincipalCache:
    def __init__(
        self,
        ttl_s: float,
        *,
        stale_ttl_s: float = 0.0,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.stale_ttl_s = max(stale_ttl_s, ttl_s)
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self._lookups: dict[str, asyncio.Future[Principal | None]] = {}
        # Entries stored before this instant are never fresh (they may predate a missed eviction).
        self._fresh_since = -math.inf
        self._fresh_suspended = False
        # Bumped by every eviction: a lookup that read the database before one does not store its answer.
        self.generation = 0

    def _age(self, key_hash: str) -> tuple[float, Principal] | None:
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        stored_at, principal = entry
        age = self._clock() - stored_at
        if age >= self.stale_ttl_s:
            del self._entries[key_hash]
            return None
        return age, principal

    def get(self, key_hash: str) -> Principal | None:
        """The principal if the database accepted this key within the fresh TTL."""
        if self._fresh_suspended:
            return None
        entry = self._entries.get(key_hash)
        if entry is None or entry[0] < self._fresh_since:
            return None
        found = self._age(key_hash)
        if found is None or found[0] >= self.ttl_s:
            return None
        return found[1]

    def get_stale(self, key_hash: str) -> Principal | None:
        """The principal if the database accepted this key within the stale TTL (outages only)."""
        found = self._age(key_hash)
        return None if found is None else found[1]

    def put(self, key_hash: str, principal: Principal, *, generation: int | None = None) -> None:
        """Store what the database said; not if an eviction came since `generation` (read before the lookup)."""
        if self.stale_ttl_s <= 0 or (generation is not None and generation != self.generation):
            return
        self._entries[key_hash] = (self._clock(), principal)
        self._entries.move_to_end(key_hash)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def discard(self, key_hash: str) -> None:
        self._entries.pop(key_hash, None)
        self._lookups.pop(key_hash, None)

    def evict(self, *, key_id: str | None = None, tenant_id: str | None = None) -> None:
        doomed = [h for h, (_, p) in self._entries.items() if p.api_key_id == key_id or p.tenant_id == tenant_id]
        for h in doomed:
            del self._entries[h]
        self.generation += 1
        # A lookup already on its way may have read the row before the change: requests from
        # now on start their own instead of joining it.
        self._lookups.clear()

    def suspend_freshness(self) -> None:
        """Evictions may be missed from now on (their channel is down): every key goes to the database."""
        self._fresh_suspended = True
        self.generation += 1

    def resume_freshness(self) -> None:
        """Evictions are heard again: entries stored from now on are fresh, older ones are not."""
        self._fresh_since = self._clock()
        self._fresh_suspended = False
        self.generation += 1
        self._lookups.clear()

    @property
    def fresh_suspended(self) -> bool:
        return self._fresh_suspended

    async def load(self, key_hash: str, lookup: Callable[[], Awaitable[Principal | None]]) -> Principal | None:
        """`lookup()`'s principal, shared by every caller that asks for `key_hash` while it runs.

        The lookup runs as a task of its own, so a caller that is cancelled (its client left)
        does not cancel it for the others; its errors reach every caller.
        """
        future = self._lookups.get(key_hash)
        if future is None:
            future = asyncio.ensure_future(lookup())
            self._lookups[key_hash] = future
            future.add_done_callback(lambda done: self._lookup_done(key_hash, done))
        return await asyncio.shield(future)

    def _lookup_done(self, key_hash: str, future: asyncio.Future[Principal | None]) -> None:
        if self._lookups.get(key_hash) is future:
            del self._lookups[key_hash]
        if not future.cancelled():
            future.exception()  # retrieved here too: every caller may have left before it ended
