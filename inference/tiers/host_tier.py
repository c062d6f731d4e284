"""The host-memory tier: one buffer of fixed-size block slots, allocated once (pinned on CUDA)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from inference.clock import Clock
from inference.hashing import BlockHash
from inference.tiers.base import Demote
from inference.tiers.layout import BlockLayout
from inference.tiers.lru_index import LruIndex, TierEntry
from inference.tiers.stats import TierStats
from inference.tiers.transfer import Fence, copy_block, wait

if TYPE_CHECKING:
    from inference.kv_event_log import BlockEvents
    from inference.settings import EngineSettings


class HostTier:
    """Slots of host memory holding whole blocks, indexed by chained hash in LRU order.

    Only the engine thread touches it (the metrics thread reads counters), so it has
    no lock. Stores are one memcpy each, made at once; a full tier evicts its LRU entry,
    handing a live one to the tier below first (a demotion). With events attached, every
    insert, refresh and removal is reported under the medium "HOST".
    """

    name = "host"
    shared = False
    persistent = False

    def __init__(
        self, layout: BlockLayout, capacity: int, *, pin_min_ttl_s: int, pin_share: float, pin_memory: bool
    ) -> None:
        assert capacity > 0
        self.layout = layout
        self.buffer = torch.empty((capacity, *layout.shape), dtype=layout.dtype, pin_memory=pin_memory)
        self.index = LruIndex(capacity, pin_min_ttl_s=pin_min_ttl_s, pin_share=pin_share)
        self.stats = TierStats()
        self._free_slots = list(range(capacity - 1, -1, -1))
        # Slots whose device-to-host copy may still be running (CUDA only).
        self._fences: dict[int, Fence] = {}
        self.events: BlockEvents | None = None
        self.medium = "HOST"

    @classmethod
    def from_settings(
        cls,
        settings: EngineSettings,
        layout: BlockLayout,
        *,
        clock: Clock,
        pin_memory: bool,
        model_fingerprint: str = "",
    ) -> HostTier | None:
        """KVGATE_KV_HOST_GIB (or _BLOCKS) of host memory; None when 0."""
        blocks = settings.kv_host_blocks
        if blocks is None:
            blocks = int(settings.kv_host_gib * 2**30) // layout.nbytes
        if blocks <= 0:
            return None
        pinning = {"pin_min_ttl_s": settings.kv_pin_min_ttl_s, "pin_share": settings.kv_pin_share}
        return cls(layout, blocks, pin_memory=pin_memory, **pinning)

    @property
    def capacity(self) -> int:
        return self.index.capacity

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self.index

    @property
    def num_pending_stores(self) -> int:
        return 0

    # -- KV events --------------------------------------------------------------------------

    def attach_events(self, events: BlockEvents, medium: str) -> None:
        """Report this tier's blocks to events from now on, starting with those it holds."""
        self.events, self.medium = events, medium
        for entry in self.index.lru_order():
            self._report_stored(entry)

    def expiry(self, block_hash: BlockHash, now: float) -> float | None:
        """The block's expiry here, or None when it is not here."""
        entry = self.index.get(block_hash)
        return None if entry is None else entry.expires_at

    def _report_stored(self, entry: TierEntry) -> None:
        if self.events is not None:
            self.events.stored(self.medium, entry.block_hash, entry.parent_hash, entry.ttl_s, entry.expires_at)

    # -- read path ----------------------------------------------------------------------

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> TierEntry | None:
        """The live entry holding exactly token_ids under block_hash; an expired one is dropped."""
        return self.index.lookup(block_hash, token_ids, now, self._evict)

    def prepare_load(self, entries: Sequence[TierEntry]) -> bool:
        if any(self.index.get(e.block_hash) is not e for e in entries):
            return False
        for entry in entries:
            entry.locks += 1
        return True

    def load(self, entry: TierEntry, dest: torch.Tensor) -> bool:
        copy_block(dest, self.data(entry))
        self.stats.loads += 1
        self.stats.bytes_read += self.layout.nbytes
        return True

    def complete_load(self, entries: Sequence[TierEntry], *, failed: Sequence[TierEntry] = ()) -> None:
        assert not failed, "host loads do not fail"
        for entry in entries:
            entry.locks -= 1

    def touch(self, entries: Sequence[TierEntry]) -> None:
        for entry in entries:
            self.index.touch(entry)

    # -- write path ---------------------------------------------------------------------

    def refresh(self, entry: TierEntry) -> bool:
        existing = self.index.get(entry.block_hash)
        if existing is None:
            return False
        self.index.refresh(existing, entry)
        self._report_stored(existing)
        return True

    def store(self, entry: TierEntry, source: torch.Tensor, *, now: float, demote: Demote | None) -> bool:
        slot = self._make_room(now, demote)
        if slot is None:
            return False
        self.insert(entry, slot, copy_block(self.buffer[slot], source))
        return True

    def _make_room(self, now: float, demote: Demote | None) -> int | None:
        """A free slot, evicting the LRU entry (demoting it, if still live) when full."""
        slot = self.free_slot()
        if slot is not None:
            return slot
        victim = self.index.pick_victim(now)
        if victim is None:  # every entry is being loaded
            return None
        if not victim.expired(now) and demote is not None:
            self.stats.demotions += 1
            demote(victim.detached(), self.data(victim))
        self.remove(victim)
        self.stats.evictions += 1
        return self.free_slot()

    def write_out_blocks(self, now: float) -> Iterator[tuple[TierEntry, torch.Tensor]]:
        for entry in self.index.lru_order():
            if not entry.expired(now):
                yield entry.detached(), self.data(entry)

    # -- slots --------------------------------------------------------------------------

    def free_slot(self) -> int | None:
        return self._free_slots.pop() if self._free_slots else None

    def insert(self, entry: TierEntry, slot: int, fence: Fence | None) -> None:
        """Index a block whose data is (being) copied into slot."""
        entry.slot = slot
        if fence is not None:
            self._fences[slot] = fence
        self.index.add(entry)
        self._report_stored(entry)
        self.stats.stores += 1
        self.stats.bytes_written += self.layout.nbytes

    def remove(self, entry: TierEntry) -> None:
        """Unindex an entry; its slot becomes free."""
        assert entry.locks == 0
        self.index.remove(entry)
        if self.events is not None:
            self.events.removed(self.medium, entry.block_hash)
        self._fences.pop(entry.slot, None)
        self._free_slots.append(entry.slot)

    def _evict(self, entry: TierEntry) -> None:
        self.remove(entry)
        self.stats.evictions += 1

    def data(self, entry: TierEntry) -> torch.Tensor:
        """The entry's block, once any copy into it has finished."""
        wait(self._fences.pop(entry.slot, None))
        return self.buffer[entry.slot]

    # -- lifecycle ----------------------------------------------------------------------

    def flush(self) -> None:
        """Stores are done when store() returns: nothing to wait for."""

    def close(self) -> None:
        """Host memory dies with the process: the engine writes it out to a persistent tier first."""
