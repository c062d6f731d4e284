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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from inference.block_pool import KVBlock
from inference.clock import Clock
from inference.hashing import BlockHash
from inference.settings import EngineSettings
from inference.tiers.disk_format import record_size
from inference.tiers.disk_tier import DiskTier
from inference.tiers.host_tier import HostTier
from inference.tiers.layout import BlockLayout, device_block
from inference.tiers.lru_index import TierEntry
from inference.tiers.offload_worker import OffloadWorker, WriteJob
from inference.tiers.staging import StagingPool
from inference.tiers.stats import TierStats
from inference.tiers.transfer import copy_block, wait

TierName = Literal["host", "disk"]


@dataclass(frozen=True, slots=True)
class TierHit:
    """A block found below the device: which tier holds it, and its entry there."""

    tier: TierName
    entry: TierEntry


class TierManager:
    def __init__(
        self,
        *,
        cache: torch.Tensor,
        clock: Clock,
        host: HostTier | None,
        disk: DiskTier | None,
        staging_blocks: int = 64,
    ) -> None:
        assert host is not None or disk is not None
        self.cache = cache
        self.clock = clock
        self.layout = BlockLayout.of_pool(cache)
        self.host = host
        self.disk = disk
        self.closed = False
        self.staging: StagingPool | None = None
        self.worker: OffloadWorker | None = None
        if disk is not None:
            pin = cache.device.type == "cuda"
            self.staging = StagingPool(
                self.layout,
                staging_blocks,
                record_size=disk.record_size,
                payload_offset=disk.payload_offset,
                pin_memory=pin,
            )
            self.worker = OffloadWorker(disk, self.staging)
            self._read_buffer = torch.empty(self.layout.nbytes, dtype=torch.uint8, pin_memory=pin)

    @classmethod
    def from_settings(cls, settings: EngineSettings, cache: torch.Tensor, clock: Clock) -> TierManager | None:
        """The tiers the settings ask for, or None when there are none."""
        layout = BlockLayout.of_pool(cache)
        pinning = {"pin_min_ttl_s": settings.kv_pin_min_ttl_s, "pin_share": settings.kv_pin_share}
        host_blocks = settings.kv_host_blocks
        if host_blocks is None:
            host_blocks = int(settings.kv_host_gib * 2**30) // layout.nbytes
        disk_blocks = settings.kv_disk_blocks
        if disk_blocks is None:  # a record is the block plus its header page: the limit counts both
            disk_blocks = int(settings.kv_disk_gib * 2**30) // record_size(layout.block_size, layout.nbytes)
        host = None
        if host_blocks > 0:
            host = HostTier(layout, host_blocks, pin_memory=cache.device.type == "cuda", **pinning)
        disk = None
        if settings.kv_disk_dir is not None and disk_blocks > 0:
            disk = DiskTier(settings.kv_disk_dir, layout, disk_blocks, clock=clock, **pinning)
        if host is None and disk is None:
            return None
        staging = max(1, int(settings.kv_offload_staging_mib * 2**20) // layout.nbytes)
        return cls(cache=cache, clock=clock, host=host, disk=disk, staging_blocks=staging)

    @property
    def tiers(self) -> list[HostTier | DiskTier]:
        return [t for t in (self.host, self.disk) if t is not None]

    def stats(self) -> dict[TierName, TierStats]:
        return {t.name: t.stats for t in self.tiers}

    # -- write path ---------------------------------------------------------------------

    def on_device_evict(self, block: KVBlock) -> None:
        """BlockPool's eviction hook: keep an unexpired committed block before its slot is reused."""
        entry = _entry_of(block, block.expires_at)
        source = device_block(self.cache, block.block_id)
        host = self.host
        if host is not None:
            existing = host.index.get(entry.block_hash)
            if existing is not None:
                host.index.refresh(existing, entry)
                return
            slot = self._host_slot(self.clock.now())
            if slot is not None:
                host.insert(entry, slot, copy_block(host.buffer[slot], source))
                return
        self._stage_for_disk(entry, source)

    def _host_slot(self, now: float) -> int | None:
        """A free host slot, evicting the host's LRU entry (demoting it, if still live) when full."""
        host = self.host
        assert host is not None
        slot = host.free_slot()
        if slot is not None:
            return slot
        victim = host.index.pick_victim(now)
        if victim is None:  # every entry is being loaded
            return None
        if not victim.expired(now) and self.disk is not None:
            host.stats.demotions += 1
            self._stage_for_disk(_copy_for_disk(victim), host.data(victim))
        host.remove(victim)
        host.stats.evictions += 1
        return host.free_slot()

    def _stage_for_disk(self, entry: TierEntry, source: torch.Tensor) -> None:
        """Snapshot a block into a staging buffer (the source is about to be reused) for the worker to write."""
        disk, staging, worker = self.disk, self.staging, self.worker
        if disk is None or staging is None or worker is None:
            return
        if disk.refresh(entry):
            return
        buffer = staging.acquire()
        fence = copy_block(staging.block(buffer), source)
        worker.submit(WriteJob(entry, buffer, fence))

    # -- read path ----------------------------------------------------------------------

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> TierHit | None:
        """The block in the fastest tier that holds it live, with exactly these token ids."""
        for tier in self.tiers:
            entry = tier.lookup(block_hash, token_ids, now)
            if entry is not None:
                return TierHit(tier.name, entry)
        return None

    def lock(self, hits: Sequence[TierHit]) -> bool:
        """Protect hits from eviction until load(); False, locking nothing, if one has gone meanwhile."""
        on_host = [h.entry for h in hits if h.tier == "host"]
        on_disk = [h.entry for h in hits if h.tier == "disk"]
        if on_host:
            assert self.host is not None
            if any(self.host.index.get(e.block_hash) is not e for e in on_host):
                return False
        if on_disk:
            assert self.disk is not None
            if not self.disk.lock(on_disk):
                return False
        for entry in on_host:
            entry.locks += 1
        return True

    def load(self, hits: Sequence[TierHit], block_ids: Sequence[int]) -> bool:
        """Copy locked hits into device blocks, then unlock them.

        False if a disk block failed verification: it is dropped from its tier, and
        the caller must not use any of block_ids.
        """
        assert len(hits) == len(block_ids)
        bad: list[TierEntry] = []
        # Disk blocks in file order: a prefix evicted tail-first sits in descending slots,
        # and reading it backwards would defeat the kernel's readahead.
        moves = sorted(zip(hits, block_ids, strict=True), key=lambda m: (m[0].tier == "disk", m[0].entry.slot))
        if self.disk is not None:
            self.disk.prefetch([h.entry for h, _ in moves if h.tier == "disk"])
        try:
            for hit, block_id in moves:
                if bad:
                    break
                dest = device_block(self.cache, block_id)
                if hit.tier == "host":
                    assert self.host is not None
                    copy_block(dest, self.host.data(hit.entry))
                    self.host.stats.loads += 1
                    self.host.stats.bytes_read += self.layout.nbytes
                else:
                    assert self.disk is not None
                    try:
                        ok = self.disk.read(hit.entry, self._read_buffer.numpy())
                    except BaseException:
                        bad.append(hit.entry)  # an unreadable record is dropped like a corrupt one
                        raise
                    if ok:
                        # The read buffer is reused for the next block, so this copy must be done first.
                        wait(copy_block(dest, self.layout.typed(self._read_buffer)))
                    else:
                        bad.append(hit.entry)
        finally:
            # Also when a read raised: locked entries must not stay unevictable.
            self._unlock(hits, bad)
        return not bad

    def _unlock(self, hits: Sequence[TierHit], bad: list[TierEntry]) -> None:
        for hit in hits:
            if hit.tier == "host":
                assert self.host is not None
                hit.entry.locks -= 1
                if not bad:
                    self.host.index.touch(hit.entry)
        on_disk = [h.entry for h in hits if h.tier == "disk"]
        if on_disk:
            assert self.disk is not None
            self.disk.unlock(on_disk, bad=bad)

    # -- lifecycle ----------------------------------------------------------------------

    def write_out(self, device_blocks: Sequence[KVBlock]) -> int:
        """At shutdown: send every live block above the disk down to it; returns how many were sent.

        Write-back alone leaves on disk only what was evicted, so a restart would lose
        the hottest prefixes, the ones still on the device or the host. Blocks go
        least recently used first, so on a full disk the newest push out the oldest.
        A block in use has no expiry yet: it gets one from now, as if released.
        """
        if self.disk is None or self.closed:
            return 0
        now = self.clock.now()
        sent = 0
        if self.host is not None:
            for entry in self.host.index.lru_order():
                if not entry.expired(now):
                    self._stage_for_disk(_copy_for_disk(entry), self.host.data(entry))
                    sent += 1
        committed = [b for b in device_blocks if b.block_hash is not None]
        for block in sorted(committed, key=lambda b: (b.ref_count > 0, b.free_seq)):
            expires_at = block.expires_at if block.ref_count == 0 else now + block.ttl_s
            if expires_at > now:
                self._stage_for_disk(_entry_of(block, expires_at), device_block(self.cache, block.block_id))
                sent += 1
        return sent

    def flush(self) -> None:
        """Wait until every block on its way to disk is written."""
        if self.worker is not None:
            self.worker.flush()

    def close(self) -> None:
        """Write what is on its way to disk and the refreshed headers, then release the disk tier and its lock."""
        if self.closed:
            return
        self.closed = True
        if self.worker is not None:
            self.worker.close()
        if self.disk is not None:
            self.disk.write_refreshed_headers()
            self.disk.close()


def _entry_of(block: KVBlock, expires_at: float) -> TierEntry:
    assert block.block_hash is not None
    return TierEntry(
        block_hash=block.block_hash,
        token_ids=block.token_ids,
        ttl_s=block.ttl_s,
        expires_at=expires_at,
        last_used=block.last_used,
    )


def _copy_for_disk(entry: TierEntry) -> TierEntry:
    """A host entry's metadata, detached from its host slot, for a disk write."""
    return dataclasses.replace(entry, slot=-1, tick=0, locks=0, dirty=False)
