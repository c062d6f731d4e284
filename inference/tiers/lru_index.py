"""The index of one lower tier: hash -> entry, in LRU order, with soft pinning and load locks.

Entries sit in one of two recency lists: pinned (TTL of at least pin_min_ttl_s, the
1-hour regions) and unpinned. The victim is an expired entry if a list head has
expired; else, while pinned entries fill at most pin_share of the tier, the least
recently used unpinned entry; else the least recently used of all. Recency is a
tier-local tick, so LRU order is exact whatever the clock does. An entry with
locks > 0 is being loaded into the device and is never chosen.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from inference.hashing import BlockHash


@dataclass(eq=False, slots=True)
class TierEntry:
    """One stored block: its chained hash, its token ids (checked on every hit) and its expiry."""

    block_hash: BlockHash
    token_ids: tuple[int, ...]
    ttl_s: int
    expires_at: float
    last_used: float
    slot: int = -1
    checksum: int = 0  # the disk tier's payload checksum
    locks: int = 0
    tick: int = 0
    dirty: bool = False  # the disk tier's header on file has an older TTL, expiry or last use
    parent_hash: BlockHash | None = None  # the previous block's hash, for KV events (not kept on disk)

    def expired(self, now: float) -> bool:
        return self.expires_at <= now

    def detached(self) -> TierEntry:
        """This entry's block metadata, free of its tier's slot, recency and locks: to store it in another tier."""
        return dataclasses.replace(self, slot=-1, tick=0, locks=0, dirty=False)


class LruIndex:
    def __init__(self, capacity: int, *, pin_min_ttl_s: int, pin_share: float) -> None:
        assert capacity >= 0 and 0.0 <= pin_share <= 1.0
        self.capacity = capacity
        self.pin_min_ttl_s = pin_min_ttl_s
        self.max_pinned = int(pin_share * capacity)
        self._pinned: OrderedDict[BlockHash, TierEntry] = OrderedDict()
        self._unpinned: OrderedDict[BlockHash, TierEntry] = OrderedDict()
        self._ticks = itertools.count()

    def __len__(self) -> int:
        return len(self._pinned) + len(self._unpinned)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._pinned or block_hash in self._unpinned

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    def get(self, block_hash: BlockHash) -> TierEntry | None:
        return self._pinned.get(block_hash) or self._unpinned.get(block_hash)

    def lookup(
        self, block_hash: BlockHash, token_ids: Sequence[int], now: float, drop: Callable[[TierEntry], None]
    ) -> TierEntry | None:
        """The live entry holding exactly token_ids under block_hash (a hash collision is a miss).

        An expired entry is never returned; unless a load holds it, drop(entry) takes it out of its tier.
        """
        entry = self.get(block_hash)
        if entry is None:
            return None
        if entry.expired(now):
            if entry.locks == 0:
                drop(entry)
            return None
        return entry if entry.token_ids == tuple(token_ids) else None

    def add(self, entry: TierEntry) -> None:
        assert entry.block_hash not in self, "hash already indexed"
        assert len(self) < self.capacity, "tier over capacity"
        entry.tick = next(self._ticks)
        self._list(entry)[entry.block_hash] = entry

    def touch(self, entry: TierEntry) -> None:
        """Mark most recently used; re-file it if its TTL moved it across the pin threshold."""
        self.remove(entry)
        self.add(entry)

    def refresh(self, entry: TierEntry, newer: TierEntry) -> None:
        """The block was stored again: keep the longest TTL and latest expiry, and make it most recent."""
        grew = newer.ttl_s > entry.ttl_s or newer.expires_at > entry.expires_at or newer.last_used > entry.last_used
        entry.dirty |= grew
        entry.ttl_s = max(entry.ttl_s, newer.ttl_s)
        entry.expires_at = max(entry.expires_at, newer.expires_at)
        entry.last_used = max(entry.last_used, newer.last_used)
        self.touch(entry)

    def remove(self, entry: TierEntry) -> None:
        for lst in (self._pinned, self._unpinned):
            if lst.get(entry.block_hash) is entry:
                del lst[entry.block_hash]
                return
        raise AssertionError("entry is not indexed")

    def pick_victim(self, now: float) -> TierEntry | None:
        """The entry to evict next (see the module doc); None when every entry is locked."""
        heads = [e for e in (self._head(self._pinned), self._head(self._unpinned)) if e is not None]
        expired = [e for e in heads if e.expired(now)]
        if expired:
            return min(expired, key=lambda e: e.expires_at)
        if len(self._pinned) <= self.max_pinned:
            unpinned = [e for e in heads if e.ttl_s < self.pin_min_ttl_s]
            heads = unpinned or heads
        return min(heads, key=lambda e: e.tick, default=None)

    def lru_order(self) -> list[TierEntry]:
        """All entries, least recently used first."""
        return sorted(self, key=lambda e: e.tick)

    def __iter__(self) -> Iterator[TierEntry]:
        yield from self._pinned.values()
        yield from self._unpinned.values()

    def _list(self, entry: TierEntry) -> OrderedDict[BlockHash, TierEntry]:
        return self._pinned if entry.ttl_s >= self.pin_min_ttl_s else self._unpinned

    @staticmethod
    def _head(lst: OrderedDict[BlockHash, TierEntry]) -> TierEntry | None:
        # Locked entries are few and short-lived (one load), so skipping them is cheap.
        return next((e for e in lst.values() if e.locks == 0), None)
