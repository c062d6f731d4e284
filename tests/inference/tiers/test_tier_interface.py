"""TierManager drives whatever KVTiers its ordered list holds: a third kind of tier plugs in unnamed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from inference.block_pool import KVBlock
from inference.clock import ManualClock
from inference.hashing import BlockHash
from inference.tiers import KVTier, TierManager
from inference.tiers.base import Demote
from inference.tiers.host_tier import HostTier
from inference.tiers.layout import BlockLayout, device_block
from inference.tiers.lru_index import TierEntry
from inference.tiers.stats import TierStats

T0 = 1_000_000.0
CACHE_SHAPE = (2, 2, 8, 16, 2, 8)  # layers, K/V, device blocks, block size, kv heads, head dim


class DictTier:
    """The smallest KVTier: copies of blocks in a dict, up to a capacity; kept across 'restarts'."""

    name = "dict"
    shared = True
    persistent = True
    num_pending_stores = 0

    def __init__(self, layout: BlockLayout, capacity: int) -> None:
        self.layout = layout
        self.capacity = capacity
        self.stats = TierStats()
        self.blocks: dict[BlockHash, tuple[TierEntry, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self.blocks)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self.blocks

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> TierEntry | None:
        entry = self.blocks.get(block_hash, (None, None))[0]
        ok = entry is not None and not entry.expired(now) and entry.token_ids == tuple(token_ids)
        return entry if ok else None

    def prepare_load(self, entries: Sequence[TierEntry]) -> bool:
        return all(self.blocks.get(e.block_hash, (None,))[0] is e for e in entries)

    def load(self, entry: TierEntry, dest: torch.Tensor) -> bool:
        dest.copy_(self.blocks[entry.block_hash][1])
        self.stats.loads += 1
        return True

    def complete_load(self, entries: Sequence[TierEntry], *, failed: Sequence[TierEntry] = ()) -> None:
        for entry in failed:
            del self.blocks[entry.block_hash]

    def touch(self, entries: Sequence[TierEntry]) -> None:
        pass

    def refresh(self, entry: TierEntry) -> bool:
        return entry.block_hash in self.blocks

    def store(self, entry: TierEntry, source: torch.Tensor, *, now: float, demote: Demote | None) -> bool:
        if len(self.blocks) >= self.capacity:
            return False
        self.blocks[entry.block_hash] = (entry, source.clone())
        self.stats.stores += 1
        return True

    def write_out_blocks(self, now: float) -> Iterator[tuple[TierEntry, torch.Tensor]]:
        return iter(())

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def evicted(cache: torch.Tensor, block_id: int, n: int) -> KVBlock:
    """Device block block_id holding random KV, committed as block n of some prompt, released at T0."""
    device_block(cache, block_id).copy_(torch.randn(device_block(cache, block_id).shape))
    block = KVBlock(block_id)
    block.block_hash, block.token_ids = b"hash-%d" % n, tuple(range(n, n + 16))
    block.ttl_s, block.last_used, block.expires_at = 300, T0, T0 + 300
    return block


def test_blocks_flow_down_an_ordered_list_through_a_tier_the_manager_does_not_know():
    cache = torch.zeros(CACHE_SHAPE)
    layout = BlockLayout.of_pool(cache)
    host = HostTier(layout, 2, pin_min_ttl_s=3600, pin_share=0.5, pin_memory=False)
    below = DictTier(layout, capacity=8)
    assert isinstance(below, KVTier) and isinstance(host, KVTier)  # by their names (what a runtime check sees)
    tiers = TierManager(cache=cache, clock=ManualClock(T0), tiers=[host, below])
    assert tiers.tier("dict") is below and tiers.tier("disk") is None

    blocks = [evicted(cache, i, n=i) for i in range(4)]
    kv = [device_block(cache, b.block_id).clone() for b in blocks]
    for block in blocks:
        tiers.on_device_evict(block)
    # The host keeps the newest two; making room, it demoted the older two into the tier below.
    assert {b"hash-2", b"hash-3"} == {e.block_hash for e in host.index} and host.stats.demotions == 2
    assert {b"hash-0", b"hash-1"} == set(below.blocks)

    hits = [tiers.lookup(b.block_hash, b.token_ids, T0 + 1) for b in blocks]
    assert [h.tier.name for h in hits if h is not None] == ["dict", "dict", "host", "host"]
    assert tiers.lookup(b"hash-0", tuple(range(99, 115)), T0 + 1) is None  # other tokens: a miss
    assert tiers.lock(hits) and tiers.load(hits, [4, 5, 6, 7])
    for i, expected in enumerate(kv):
        assert torch.equal(device_block(cache, 4 + i), expected)
    assert below.stats.loads == 2 and host.stats.loads == 2 and all(e.locks == 0 for e in host.index)

    # A hit that vanished before the lock: nothing stays locked, in any tier.
    del below.blocks[b"hash-0"]
    assert not tiers.lock(hits)
    assert all(e.locks == 0 for e in host.index)

    # Shutdown: the live host blocks are written out to the last persistent tier.
    assert tiers.write_out([]) == 2
    assert {b"hash-1", b"hash-2", b"hash-3"} == set(below.blocks)
