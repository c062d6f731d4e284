"""The device block pool: refcounted KV blocks, a hash map of committed blocks, and LRU free queues.

A block whose refcount drops to 0 keeps its hash and data and waits in a free queue
until it is reused (an eviction) or hit again. Free blocks live in one queue per TTL
class plus one queue of empty (never committed) blocks. Each TTL queue is ordered by
release time, and a block's expiry is its release time + its TTL, so every queue's
head is both its least recently used and its earliest-expiring block. Allocation
takes, in order: an empty block; the earliest-expired head; the least recently used
head. All queue operations are O(1) and allocate nothing.

Soft pinning: free blocks whose TTL is at least pin_min_ttl_s (1-hour regions) are
passed over for unpinned ones while they fill at most pin_share of the pool. Past
that share, or when only pinned blocks are left, plain LRU applies, so pinned
blocks can never wedge the pool.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import structlog

from inference.hashing import BlockHash

if TYPE_CHECKING:
    from inference.kv_event_log import BlockEvents

log = structlog.get_logger(__name__)


class KVBlock:
    __slots__ = (
        "block_hash",
        "block_id",
        "expires_at",
        "free_seq",
        "last_used",
        "next_free",
        "parent_hash",
        "prev_free",
        "queue",
        "ref_count",
        "token_ids",
        "ttl_s",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: BlockHash | None = None
        self.parent_hash: BlockHash | None = None  # the previous block's hash in its chain (for KV events)
        self.token_ids: tuple[int, ...] = ()
        self.ttl_s = 0
        self.expires_at = 0.0
        self.last_used = 0.0
        self.free_seq = 0  # release order: compares recency across queues even when the clock stands still
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None
        self.queue: FreeBlockQueue | None = None

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_count}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """An intrusive doubly linked list of free blocks between two sentinels."""

    def __init__(self, key: int) -> None:
        self.key = key
        self.head = KVBlock(-1)
        self.tail = KVBlock(-1)
        self.head.next_free = self.tail
        self.tail.prev_free = self.head
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def first(self) -> KVBlock | None:
        block = self.head.next_free
        return None if block is self.tail else block

    def append(self, block: KVBlock) -> None:
        self._insert_after(self.tail.prev_free, block)

    def appendleft(self, block: KVBlock) -> None:
        self._insert_after(self.head, block)

    def remove(self, block: KVBlock) -> None:
        assert block.queue is self, "block is not in this queue"
        block.prev_free.next_free = block.next_free  # type: ignore[union-attr]
        block.next_free.prev_free = block.prev_free  # type: ignore[union-attr]
        block.prev_free = block.next_free = None
        block.queue = None
        self.size -= 1

    def __iter__(self) -> Iterator[KVBlock]:
        block = self.head.next_free
        while block is not self.tail:
            assert block is not None
            yield block
            block = block.next_free

    def _insert_after(self, prev: KVBlock | None, block: KVBlock) -> None:
        assert block.queue is None and prev is not None, "block is already queued"
        block.prev_free, block.next_free = prev, prev.next_free
        prev.next_free.prev_free = block  # type: ignore[union-attr]
        prev.next_free = block
        block.queue = self
        self.size += 1


EMPTY = -1  # queue key of blocks that hold no committed data


class BlockPool:
    """All KV blocks of the device, allocated once.

    on_evict(block) is called just before an unexpired committed block's data is
    reused, so a lower tier can copy it out first. pin_share 0 turns pinning off.
    With `events` set (attach_events), every commit is reported stored and every
    uncache (eviction, expiry found on lookup, replacement) removed, under `medium`.
    """

    def __init__(
        self,
        num_blocks: int,
        on_evict: Callable[[KVBlock], None] | None = None,
        *,
        pin_min_ttl_s: int = 3600,
        pin_share: float = 0.0,
    ) -> None:
        assert num_blocks > 0 and 0.0 <= pin_share <= 1.0
        self.pin_min_ttl_s = pin_min_ttl_s
        self.max_pinned_free = int(pin_share * num_blocks)
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.cached: dict[BlockHash, KVBlock] = {}
        self.empty = FreeBlockQueue(EMPTY)
        self.by_ttl: dict[int, FreeBlockQueue] = {}
        self.on_evict = on_evict
        self.num_evictions = 0
        self._free_seq = itertools.count(1)
        self.num_expired_evictions = 0
        # Kept by hand so other threads (metrics) can read it without walking the queues.
        self._num_free = num_blocks
        for block in self.blocks:
            self.empty.append(block)
        self.events: BlockEvents | None = None
        self.medium = "CPU"

    def attach_events(self, events: BlockEvents, medium: str) -> None:
        """Report commits and uncaches to events from now on (the pool must hold no committed block yet)."""
        assert not self.cached, "attach events before anything is committed"
        self.events, self.medium = events, medium

    def expiry(self, block_hash: BlockHash, now: float) -> float | None:
        """When the block would expire if nothing used it again: a block in use counts as released now."""
        block = self.cached.get(block_hash)
        if block is None:
            return None
        return now + block.ttl_s if block.ref_count > 0 else block.expires_at

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def get_cached(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> KVBlock | None:
        """The live committed block holding exactly token_ids under block_hash, if any.

        An expired block is uncached on the spot, so its content can be recomputed and
        committed afresh; a hash match with other tokens (a collision) is a miss.
        """
        block = self.cached.get(block_hash)
        if block is None:
            return None
        if block.ref_count == 0 and block.expires_at <= now:
            self._uncache(block)
            self._requeue(block)
            return None
        if block.token_ids != tuple(token_ids):
            return None
        return block

    def touch(self, blocks: Sequence[KVBlock], ttl_s: Sequence[int], now: float) -> None:
        """Take a reference on hit blocks; a block's TTL is the longest any user asked for."""
        for block, ttl in zip(blocks, ttl_s, strict=True):
            if block.ref_count == 0:
                block.queue.remove(block)  # type: ignore[union-attr]
                self._num_free -= 1
            block.ref_count += 1
            block.ttl_s = max(block.ttl_s, ttl)
            block.last_used = now

    def allocate(self, n: int, now: float) -> list[KVBlock]:
        """n blocks with refcount 1; evicts committed blocks as needed. The caller checks num_free."""
        assert n <= self.num_free, f"asked for {n} blocks, {self.num_free} free"
        out = []
        for _ in range(n):
            block = self._pick_victim(now)
            block.queue.remove(block)  # type: ignore[union-attr]
            self._num_free -= 1
            if block.block_hash is not None:
                self.num_evictions += 1
                if block.expires_at <= now:
                    self.num_expired_evictions += 1
                elif self.on_evict is not None:
                    try:
                        self.on_evict(block)
                    except Exception:
                        # Keeping an evicted block below is best effort: losing it is a later cache
                        # miss, whereas raising here would leave this block half-allocated.
                        log.exception("kv_evict_hook_failed", block_id=block.block_id)
                self._uncache(block)
            block.ref_count = 1
            block.last_used = now
            out.append(block)
        return out

    def commit(
        self,
        block: KVBlock,
        block_hash: BlockHash,
        token_ids: Sequence[int],
        ttl_s: int,
        now: float,
        parent: BlockHash | None = None,
    ) -> bool:
        """Register a computed full block under its hash (parent: the previous block's). False if that hash is
        already live elsewhere."""
        assert block.ref_count > 0 and block.block_hash is None
        other = self.cached.get(block_hash)
        if other is not None:
            if other.ref_count > 0 or other.expires_at > now:
                return False
            self._uncache(other)
            self._requeue(other)
        block.block_hash = block_hash
        block.parent_hash = parent
        block.token_ids = tuple(token_ids)
        block.ttl_s = ttl_s
        block.last_used = now
        self.cached[block_hash] = block
        if self.events is not None:
            # In use, it expires no sooner than a TTL from now; the log refreshes it if it lives on.
            self.events.stored(self.medium, block_hash, parent, ttl_s, now + ttl_s)
        return True

    def release(self, blocks: Sequence[KVBlock], now: float) -> None:
        """Drop one reference on each block. Freed blocks queue deepest first, so they are evicted first."""
        for block in reversed(blocks):
            assert block.ref_count > 0
            block.ref_count -= 1
            if block.ref_count == 0:
                block.last_used = now
                block.expires_at = now + block.ttl_s
                block.free_seq = next(self._free_seq)
                self._requeue(block)
                self._num_free += 1

    def _requeue(self, block: KVBlock) -> None:
        if block.queue is not None:
            block.queue.remove(block)
        if block.block_hash is None:
            self.empty.appendleft(block)
        else:
            self._ttl_queue(block.ttl_s).append(block)

    def _ttl_queue(self, ttl_s: int) -> FreeBlockQueue:
        queue = self.by_ttl.get(ttl_s)
        if queue is None:
            queue = self.by_ttl[ttl_s] = FreeBlockQueue(ttl_s)
        return queue

    def _pick_victim(self, now: float) -> KVBlock:
        block = self.empty.first()
        if block is not None:
            return block
        heads = [b for q in self.by_ttl.values() if (b := q.first()) is not None]
        expired = [b for b in heads if b.expires_at <= now]
        if expired:
            return min(expired, key=lambda b: b.expires_at)
        if self.num_pinned_free <= self.max_pinned_free:
            unpinned = [b for b in heads if b.ttl_s < self.pin_min_ttl_s]
            heads = unpinned or heads
        return min(heads, key=lambda b: b.free_seq)

    @property
    def num_pinned_free(self) -> int:
        """Free cached blocks that soft pinning protects (TTL of at least pin_min_ttl_s)."""
        return sum(len(q) for ttl, q in self.by_ttl.items() if ttl >= self.pin_min_ttl_s)

    def _uncache(self, block: KVBlock) -> None:
        assert block.block_hash is not None
        del self.cached[block.block_hash]
        if self.events is not None:
            self.events.removed(self.medium, block.block_hash)
        block.block_hash = None
        block.parent_hash = None
        block.token_ids = ()
        block.ttl_s = 0
        block.expires_at = 0.0

    def check_invariants(self) -> None:
        """Every block is either referenced or queued exactly once; the hash map matches the blocks."""
        queued = 0
        for queue in [self.empty, *self.by_ttl.values()]:
            for block in queue:
                assert block.ref_count == 0, block
                assert block.queue is queue
                assert (block.block_hash is None) == (queue.key == EMPTY), block
                assert queue.key == EMPTY or block.ttl_s == queue.key
                queued += 1
            assert queued >= 0
        assert queued == self.num_free == len(self.empty) + sum(len(q) for q in self.by_ttl.values())
        for block in self.blocks:
            assert block.ref_count >= 0
            assert (block.ref_count == 0) == (block.queue is not None), block
            if block.block_hash is not None:
                assert self.cached[block.block_hash] is block
        assert len(self.cached) == sum(b.block_hash is not None for b in self.blocks)
