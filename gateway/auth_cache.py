"""Recently authenticated API keys, kept for a couple of seconds to spare a database read per request.

Revoking a key or suspending a tenant through the admin API evicts at once; a
change made elsewhere (the CLI, another gateway process) takes effect within the
TTL (KVGATE_AUTH_CACHE_TTL_S, 0 to disable). A key's expiry is checked on every
use, cached or not.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.services.keys import Principal


class PrincipalCache:
    def __init__(self, ttl_s: float, *, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Principal]] = OrderedDict()

    def get(self, key_hash: str) -> Principal | None:
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        stored_at, principal = entry
        if self._clock() - stored_at >= self.ttl_s:
            del self._entries[key_hash]
            return None
        return principal

    def put(self, key_hash: str, principal: Principal) -> None:
        if self.ttl_s <= 0:
            return
        self._entries[key_hash] = (self._clock(), principal)
        self._entries.move_to_end(key_hash)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def evict(self, *, key_id: str | None = None, tenant_id: str | None = None) -> None:
        doomed = [h for h, (_, p) in self._entries.items() if p.api_key_id == key_id or p.tenant_id == tenant_id]
        for h in doomed:
            del self._entries[h]
