"""The host-memory tier: one buffer of fixed-size block slots, allocated once (pinned on CUDA)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inference.hashing import BlockHash
from inference.tiers.layout import BlockLayout
from inference.tiers.lru_index import LruIndex, TierEntry
from inference.tiers.stats import TierStats
from inference.tiers.transfer import Fence, wait


class HostTier:
    """Slots of host memory holding whole blocks, indexed by chained hash in LRU order.

    Only the engine thread touches it (the metrics thread reads counters), so it has
    no lock. The tier manager decides what is stored and what is demoted.
    """

    name = "host"

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

    @property
    def capacity(self) -> int:
        return self.index.capacity

    def __len__(self) -> int:
        return len(self.index)

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> TierEntry | None:
        """The live entry holding exactly token_ids under block_hash; an expired one is dropped."""
        return self.index.lookup(block_hash, token_ids, now, self._evict)

    def free_slot(self) -> int | None:
        return self._free_slots.pop() if self._free_slots else None

    def insert(self, entry: TierEntry, slot: int, fence: Fence | None) -> None:
        """Index a block whose data is (being) copied into slot."""
        entry.slot = slot
        if fence is not None:
            self._fences[slot] = fence
        self.index.add(entry)
        self.stats.stores += 1
        self.stats.bytes_written += self.layout.nbytes

    def remove(self, entry: TierEntry) -> None:
        """Unindex an entry; its slot becomes free."""
        assert entry.locks == 0
        self.index.remove(entry)
        self._fences.pop(entry.slot, None)
        self._free_slots.append(entry.slot)

    def _evict(self, entry: TierEntry) -> None:
        self.remove(entry)
        self.stats.evictions += 1

    def data(self, entry: TierEntry) -> torch.Tensor:
        """The entry's block, once any copy into it has finished."""
        wait(self._fences.pop(entry.slot, None))
        return self.buffer[entry.slot]
