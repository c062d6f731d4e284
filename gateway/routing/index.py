"""The router's block index: which engine holds which block, in which kind of tier, until when.

Fed by the engines' KV events (gateway/routing/event_consumer.py), by their snapshots on a
resync, and, for engines without events, by the router's own choices (`insert_routed`). Pure:
no I/O, no clock of its own (every time is a `now` argument, wall-clock epoch seconds like the
events' `expires_at`), so the simulator (bench/route_sim.py) drives the same code.

Per block hash the index keeps, for each engine that holds it, the expiry of its device copy
and of its lower-tier (host or disk) copy: a block often sits in both, and losing one (a device
eviction) must not forget the other. The shared tier (Redis, medium "REMOTE") is one store that
every engine reads, so its blocks are kept once, not per engine: whichever engine wrote a block
there, any engine of `shared_readers` can read it. An engine's AllBlocksCleared, snapshot or
removal from the pool clears its device and lower copies only; shared blocks leave by their own
removals or their expiry.

Expired entries are ignored at once and pruned lazily (when a lookup meets them). Memory is
bounded: past `max_entries` (engine copies plus shared blocks) the blocks stored or refreshed
longest ago are dropped first, which only makes the router miss a prefix it could have found.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence

from gateway.routing.types import PrefixMatch
from inference.hashing import BlockHash
from kvgate.kv_events import (
    DEVICE_MEDIA,
    LOWER_MEDIA,
    SHARED_MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVSnapshot,
    SnapshotBlock,
)

DEVICE, LOWER, SHARED = 0, 1, 2  # where a block sits, best first: the index of its PrefixMatch field
_ABSENT = 0.0  # an expiry that is always past
# Measured: about 400 bytes for a block's first entry, 115 for each further engine holding it; so at
# most about 400 MB (GatewaySettings.route_index_max_entries).
DEFAULT_MAX_ENTRIES = 1_000_000


def medium_class(medium: str | None) -> int:
    """DEVICE, LOWER or SHARED for an event's medium; an unknown or missing medium counts as device
    (vLLM's events without a medium are its GPU pool)."""
    if medium is None or medium in DEVICE_MEDIA:
        return DEVICE
    if medium in LOWER_MEDIA:
        return LOWER
    if medium in SHARED_MEDIA:
        return SHARED
    return DEVICE


class BlockIndex:
    """Block hash -> {engine id: expiries of its device and lower-tier copies}, plus the shared tier's blocks."""

    def __init__(self, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries <= 0:
            raise ValueError("max_entries must be positive")
        self.max_entries = max_entries
        # [device expiry, lower expiry]; _ABSENT where that copy is absent. Ordered by last store.
        self._engines: OrderedDict[BlockHash, dict[str, list[float]]] = OrderedDict()
        self._shared: OrderedDict[BlockHash, float] = OrderedDict()
        self._by_engine: dict[str, set[BlockHash]] = {}  # so that clearing one engine is O(its blocks)
        self._copies = 0  # engine entries in _engines

    def __len__(self) -> int:
        """Entries held: one per (block, engine) plus one per shared block, expired ones not yet pruned included."""
        return self._copies + len(self._shared)

    def engines(self) -> list[str]:
        """The engines with at least one entry."""
        return [engine for engine, blocks in self._by_engine.items() if blocks]

    # -- writes -------------------------------------------------------------------------------------

    def apply(self, engine_id: str, batch: KVEventBatch, *, now: float) -> None:
        """One engine's event batch, in order. Stores without an expiry never expire (vLLM's events carry
        none: its removals are the only signal); stores already expired are ignored."""
        for event in batch.events:
            if isinstance(event, BlockStored):
                expires_at = math.inf if event.expires_at is None else event.expires_at
                if expires_at <= now:
                    continue
                where = medium_class(event.medium)
                for block_hash in event.block_hashes:
                    self._store(engine_id, block_hash, where, expires_at)
            elif isinstance(event, BlockRemoved):
                classes = (DEVICE, LOWER, SHARED) if event.medium is None else (medium_class(event.medium),)
                for block_hash in event.block_hashes:
                    for where in classes:
                        self._remove(engine_id, block_hash, where)
            elif isinstance(event, AllBlocksCleared):
                self.forget_engine(engine_id)
        self._bound()

    def replace_engine(self, engine_id: str, snapshot: KVSnapshot, *, now: float) -> None:
        """Everything known of one engine becomes its snapshot (a resync). Shared blocks in it are added."""
        self.forget_engine(engine_id)
        self.add_snapshot_blocks(engine_id, snapshot.blocks, now=now)

    def add_snapshot_blocks(self, engine_id: str, blocks: Iterable[SnapshotBlock], *, now: float) -> None:
        """Part of a snapshot, after forget_engine: what replace_engine does, in pieces a caller can interleave
        with other work (a large snapshot would stall an event loop)."""
        for block in blocks:
            if block.expires_at <= now:
                continue
            try:
                block_hash = bytes.fromhex(block.block_hash)
            except ValueError:
                continue  # one malformed entry costs one block, not the resync
            self._store(engine_id, block_hash, medium_class(block.medium), block.expires_at)
        self._bound()

    def insert_routed(self, engine_id: str, block_hashes: Iterable[BlockHash], ttl_s: float, *, now: float) -> None:
        """The fallback without events: a request's blocks were sent to engine_id, which will hold them on
        its device for about ttl_s, so the next turn with this prefix goes there too."""
        if ttl_s <= 0:
            return
        expires_at = now + ttl_s
        for block_hash in block_hashes:
            self._store(engine_id, block_hash, DEVICE, expires_at)
        self._bound()

    def forget_engine(self, engine_id: str) -> None:
        """Drop an engine's device and lower-tier entries (it restarted, left the pool, or cannot be resynced)."""
        for block_hash in self._by_engine.pop(engine_id, ()):
            holders = self._engines.get(block_hash)
            if holders is not None and holders.pop(engine_id, None) is not None:
                self._copies -= 1
                if not holders:
                    del self._engines[block_hash]

    def _store(self, engine_id: str, block_hash: BlockHash, where: int, expires_at: float) -> None:
        if where == SHARED:
            if block_hash not in self._shared or self._shared[block_hash] < expires_at:
                self._shared[block_hash] = expires_at
            self._shared.move_to_end(block_hash)
            return
        holders = self._engines.get(block_hash)
        if holders is None:
            holders = self._engines[block_hash] = {}
        else:
            self._engines.move_to_end(block_hash)
        copies = holders.get(engine_id)
        if copies is None:
            copies = holders[engine_id] = [_ABSENT, _ABSENT]
            self._copies += 1
            self._by_engine.setdefault(engine_id, set()).add(block_hash)
        copies[where] = max(copies[where], expires_at)

    def _remove(self, engine_id: str, block_hash: BlockHash, where: int) -> None:
        if where == SHARED:
            self._shared.pop(block_hash, None)
            return
        holders = self._engines.get(block_hash)
        copies = holders.get(engine_id) if holders is not None else None
        if copies is None:
            return
        copies[where] = _ABSENT
        if copies[DEVICE] == _ABSENT and copies[LOWER] == _ABSENT:
            self._drop(block_hash, engine_id)

    def _drop(self, block_hash: BlockHash, engine_id: str) -> None:
        holders = self._engines[block_hash]
        del holders[engine_id]
        self._copies -= 1
        if not holders:
            del self._engines[block_hash]
        blocks = self._by_engine.get(engine_id)
        if blocks is not None:
            blocks.discard(block_hash)

    def _bound(self) -> None:
        # Oldest first, from whichever of the two maps holds more; each eviction frees at least one entry.
        while len(self) > self.max_entries:
            if self._copies >= len(self._shared):
                block_hash, holders = next(iter(self._engines.items()))
                for engine_id in list(holders):
                    self._drop(block_hash, engine_id)
            else:
                self._shared.popitem(last=False)

    # -- reads --------------------------------------------------------------------------------------

    def match(
        self,
        block_hashes: Sequence[BlockHash],
        engine_ids: Iterable[str],
        *,
        now: float,
        shared_readers: Collection[str] | None = None,
    ) -> dict[str, PrefixMatch]:
        """For each engine, how many of the request's LEADING blocks it holds: first those on its device,
        then those it has in a lower tier (or on its device), then those it can read from the shared tier
        (or has anywhere). The walk stops for an engine at the first block it cannot get, and for all of
        them once none can continue: O(matched blocks × engines still matching). `shared_readers` are the
        engines with the shared tier (None: all of them)."""
        counts = {engine_id: [0, 0, 0] for engine_id in engine_ids}
        phase = dict.fromkeys(counts, DEVICE)  # the worst tier a block of the prefix needed so far
        readers = phase.keys() if shared_readers is None else shared_readers
        active = list(counts)  # the engines whose prefix has not ended yet
        no_holders: dict[str, list[float]] = {}
        for block_hash in block_hashes:
            holders = self._engines.get(block_hash, no_holders)
            shared_until = self._shared.get(block_hash)
            shared = shared_until is not None and shared_until > now
            if shared_until is not None and not shared:
                del self._shared[block_hash]  # lazily pruned
            if not holders and not shared:
                break
            still = []
            for engine_id in active:
                # Inlined (this loop is the router's per-request cost): the best live copy, else the shared tier.
                copies = holders.get(engine_id)
                if copies is not None and copies[DEVICE] > now:
                    where = DEVICE
                elif copies is not None and copies[LOWER] > now:
                    where = LOWER
                elif shared and engine_id in readers:
                    where = SHARED
                else:
                    if copies is not None and copies[DEVICE] <= now and copies[LOWER] <= now:
                        self._drop(block_hash, engine_id)  # both copies expired: lazily pruned
                    continue
                worst = phase[engine_id]
                if where > worst:
                    phase[engine_id] = worst = where
                counts[engine_id][worst] += 1
                still.append(engine_id)
            if not still:
                break
            active = still
        return {engine_id: PrefixMatch(*c) for engine_id, c in counts.items()}
