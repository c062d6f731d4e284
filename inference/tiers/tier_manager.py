"""The tiers below the device pool: write-back on eviction, lookup across tiers, promotion on hit.

Write path (engine thread, inside BlockPool.allocate, before the block is reused):
an unexpired committed block evicted from the device is copied into a host slot.
If the host is full its LRU entry makes room: an unexpired one is demoted (copied
into a staging buffer and written to disk by the offload worker), an expired one
is dropped. With no host tier, device evictions go to disk the same way. Every
copy the engine thread makes is one memcpy of one block; checksums and file
writes happen in the worker.

Read path: the cache manager looks each leading block up on the device, then here
(host, then disk). Hits are locked so nothing evicts them, then copied into fresh
device blocks before the prefill runs. A disk block whose checksum fails is dropped
and the load reports failure; the request is retried without it.

Tiers are inclusive: a promoted block stays in its tier, so evicting it again only
refreshes that entry's recency and expiry instead of copying it again.

The manager knows no tier by name: it drives an ordered list of `KVTier`s, fastest
first, built from the settings by the classes in TIER_TYPES. A block goes to the first
tier that takes it; a tier making room hands its live victim to the tiers below it;
lookups try the tiers in order; at shutdown the tiers above the last persistent one
(and the device) are written out to it (a local one, the disk, when there is one).

Shared tiers (`shared = True`: Redis) are also written through: every block committed
or hit on the device is offered to them at once (share()), so other engines, and this
one after a crash, find it. Their lookups go by the chunk (lookup_prefix), and their
loads can start before admission (prefetch), while the scheduler runs other requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inference.block_pool import KVBlock
from inference.clock import Clock
from inference.hashing import BlockHash
from inference.kv_event_log import BlockEvents, Probe, tier_medium
from inference.settings import EngineSettings
from inference.tiers.base import Demote, KVTier, KVTierType, Prefetching
from inference.tiers.disk_tier import DiskTier
from inference.tiers.host_tier import HostTier
from inference.tiers.layout import BlockLayout, device_block
from inference.tiers.lru_index import TierEntry
from inference.tiers.prefix_lookup import PrefixLookup
from inference.tiers.redis_tier import RedisTier
from inference.tiers.stats import TierStats

# The tier classes, fastest first: the order blocks move down in and lookups go in.
TIER_TYPES: tuple[KVTierType, ...] = (HostTier, DiskTier, RedisTier)
DEVICE = "device"
# Every name a hit can be counted under, device first: the keys of cached_tokens_by_tier.
TIER_NAMES: tuple[str, ...] = (DEVICE, *(t.name for t in TIER_TYPES))


@dataclass(frozen=True, slots=True)
class TierHit:
    """A block found below the device: the tier that holds it, and its entry there."""

    tier: KVTier
    entry: TierEntry


class TierManager:
    def __init__(self, *, cache: torch.Tensor, clock: Clock, tiers: Sequence[KVTier]) -> None:
        assert tiers and len({t.name for t in tiers}) == len(tiers)
        self.cache = cache
        self.clock = clock
        self.layout = tiers[0].layout  # every tier's (BlockLayout.of_pool of the cache, with the plan digest)
        assert all(t.layout == self.layout for t in tiers) and self.layout.shape == BlockLayout.of_pool(cache).shape
        self.tiers = list(tiers)
        self.shared = [t for t in self.tiers if t.shared]  # written through (share())
        self.closed = False

    @classmethod
    def from_settings(
        cls,
        settings: EngineSettings,
        cache: torch.Tensor,
        clock: Clock,
        *,
        model_fingerprint: str = "",
        compute: str = "",
    ) -> TierManager | None:
        """The tiers the settings ask for, in TIER_TYPES order, or None when there are none.

        compute: the kernel plan's digest, in every tier's layout (BlockLayout.compute)."""
        layout = BlockLayout.of_pool(cache, compute)
        pin = cache.device.type == "cuda"
        built = (
            kind.from_settings(settings, layout, clock=clock, pin_memory=pin, model_fingerprint=model_fingerprint)
            for kind in TIER_TYPES
        )
        tiers = [tier for tier in built if tier is not None]
        return cls(cache=cache, clock=clock, tiers=tiers) if tiers else None

    def tier(self, name: str) -> KVTier | None:
        """The tier called name, if the engine has one."""
        return next((t for t in self.tiers if t.name == name), None)

    def attach_events(self, events: BlockEvents) -> dict[str, Probe]:
        """Have every tier that reports KV events (`attach_events`, `expiry`) report to events.

        Returns each such tier's expiry probe by event medium, for KVEventLog.sweep. A tier
        without those methods publishes nothing (routers then see only the tiers that do).
        """
        probes: dict[str, Probe] = {}
        for tier in self.tiers:
            attach = getattr(tier, "attach_events", None)
            if attach is None:
                continue
            medium = tier_medium(tier.name)
            attach(events, medium)
            probes[medium] = tier.expiry  # type: ignore[attr-defined]
        return probes

    def stats(self) -> dict[str, TierStats]:
        return {t.name: t.stats for t in self.tiers}

    @property
    def num_pending_stores(self) -> int:
        """Blocks on their way into a tier (queued for the disk)."""
        return sum(t.num_pending_stores for t in self.tiers)

    # -- write path ---------------------------------------------------------------------

    def on_device_evict(self, block: KVBlock) -> None:
        """BlockPool's eviction hook: keep an unexpired committed block before its slot is reused."""
        self._store(0, _entry_of(block, block.expires_at), device_block(self.cache, block.block_id))

    def share(self, blocks: Sequence[KVBlock]) -> None:
        """Offer blocks just computed, or just hit, on the device to the shared tiers (write-through).

        Write-back alone would share a block only once it is evicted here, and never if
        this engine dies first; and a device hit extends a block's life here, which the
        shared copy must follow for another engine to find it within its TTL. A tier
        refreshes what it has (or knows it has recently enough) and stores the rest
        (queued: it copies the block and sends it from its own thread).
        """
        now = self.clock.now()
        for block in blocks:
            entry = _entry_of(block, now + block.ttl_s)
            for tier in self.shared:
                if not tier.refresh(entry):
                    tier.store(entry, device_block(self.cache, block.block_id), now=now, demote=None)

    def _store(self, first: int, entry: TierEntry, source: torch.Tensor) -> None:
        """Keep a block in tiers[first:]: refresh it where it is already, else store it in the first with room."""
        now = self.clock.now()
        for i in range(first, len(self.tiers)):
            tier = self.tiers[i]
            if tier.refresh(entry):
                return
            demote = self._demoter(i + 1) if i + 1 < len(self.tiers) else None
            if tier.store(entry, source, now=now, demote=demote):
                return
        # No tier had room (every victim is being loaded): the block is not kept.

    def _demoter(self, below: int) -> Demote:
        return lambda entry, data: self._store(below, entry, data)

    # -- read path ----------------------------------------------------------------------

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> TierHit | None:
        """The block in the fastest tier that holds it live, with exactly these token ids."""
        for tier in self.tiers:
            entry = tier.lookup(block_hash, token_ids, now)
            if entry is not None:
                return TierHit(tier, entry)
        return None

    def lookup_prefix(self, keys: Sequence[tuple[BlockHash, Sequence[int]]], now: float) -> PrefixLookup:
        """Lookups of a request's leading blocks (hash, token ids), answered as asked: remote tiers by the chunk."""
        return PrefixLookup(self.tiers, keys, now)

    def prefetch(self, hits: Sequence[TierHit]) -> bool:
        """Start the hits' remote fetches; True when none is still on its way (local tiers are always ready)."""
        ready = True
        for tier, entries in self._by_tier(hits):
            if isinstance(tier, Prefetching):
                ready = tier.prefetch(entries) and ready
        return ready

    def lock(self, hits: Sequence[TierHit]) -> bool:
        """Protect hits from eviction until load(); False, locking nothing, if one has gone meanwhile."""
        locked: list[tuple[KVTier, list[TierEntry]]] = []
        for tier, entries in self._by_tier(hits):
            if not tier.prepare_load(entries):
                for done, done_entries in locked:
                    done.complete_load(done_entries)
                return False
            locked.append((tier, entries))
        return True

    def load(self, hits: Sequence[TierHit], block_ids: Sequence[int]) -> bool:
        """Copy locked hits into device blocks, then unlock them.

        False if a block failed verification (disk): it is dropped from its tier, and
        the caller must not use any of block_ids.
        """
        assert len(hits) == len(block_ids)
        rank = {id(tier): i for i, tier in enumerate(self.tiers)}
        # Fastest tier first; within a tier in slot (file) order, for the disk's readahead.
        moves = sorted(zip(hits, block_ids, strict=True), key=lambda m: (rank[id(m[0].tier)], m[0].entry.slot))
        failed: TierHit | None = None
        try:
            for hit, block_id in moves:
                try:
                    ok = hit.tier.load(hit.entry, device_block(self.cache, block_id))
                except BaseException:
                    failed = hit  # an unreadable record is dropped like a corrupt one
                    raise
                if not ok:
                    failed = hit
                    break
        finally:
            # Also when a load raised: locked entries must not stay unevictable.
            for tier, entries in self._by_tier(hits):
                tier.complete_load(entries, failed=[failed.entry] if failed is not None and failed.tier is tier else [])
        if failed is None:
            for tier, entries in self._by_tier(hits):
                tier.touch(entries)
        return failed is None

    def _by_tier(self, hits: Sequence[TierHit]) -> list[tuple[KVTier, list[TierEntry]]]:
        """The hits' entries grouped by tier, tiers in order, entries in hit order."""
        groups = [(tier, [h.entry for h in hits if h.tier is tier]) for tier in self.tiers]
        return [(tier, entries) for tier, entries in groups if entries]

    # -- lifecycle ----------------------------------------------------------------------

    def write_out(self, device_blocks: Sequence[KVBlock]) -> int:
        """At shutdown: send every live block above the last persistent tier down to it; returns how many.

        Write-back alone leaves on disk only what was evicted, so a restart would lose
        the hottest prefixes, the ones still on the device or the host. Blocks go
        least recently used first, so on a full disk the newest push out the oldest.
        A block in use has no expiry yet: it gets one from now, as if released.
        """
        # A local persistent tier (the disk) is the target; a shared one only when there is none
        # (it has every block written through already: this refreshes their expiry).
        persistent = [i for i, t in enumerate(self.tiers) if t.persistent]
        target = max((i for i in persistent if not self.tiers[i].shared), default=max(persistent, default=None))
        if target is None or self.closed:
            return 0
        now = self.clock.now()
        sent = 0
        for tier in self.tiers[:target]:
            for entry, data in tier.write_out_blocks(now):
                self._store(target, entry, data)
                sent += 1
        committed = [b for b in device_blocks if b.block_hash is not None]
        for block in sorted(committed, key=lambda b: (b.ref_count > 0, b.free_seq)):
            expires_at = block.expires_at if block.ref_count == 0 else now + block.ttl_s
            if expires_at > now:
                self._store(target, _entry_of(block, expires_at), device_block(self.cache, block.block_id))
                sent += 1
        return sent

    def flush(self) -> None:
        """Wait until every block on its way into a tier is stored."""
        for tier in self.tiers:
            tier.flush()

    def close(self) -> None:
        """Finish what is on its way into the tiers and release them (the disk writes refreshed headers)."""
        if self.closed:
            return
        self.closed = True
        for tier in self.tiers:
            tier.close()


def _entry_of(block: KVBlock, expires_at: float) -> TierEntry:
    assert block.block_hash is not None
    return TierEntry(
        block_hash=block.block_hash,
        parent_hash=block.parent_hash,
        token_ids=block.token_ids,
        ttl_s=block.ttl_s,
        expires_at=expires_at,
        last_used=block.last_used,
    )
