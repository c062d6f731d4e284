"""Per-request use of the block pool: prefix hits, slot allocation, commits, and the cache accounting."""

from __future__ import annotations

from collections.abc import Sequence

from inference.block_pool import BlockPool, KVBlock
from inference.clock import Clock
from inference.hashing import BlockHash, BlockHasher
from inference.request import Request
from inference.tiers import TIER_NAMES, TierHit, TierManager
from inference.tiers.tier_manager import DEVICE
from inference.types import CacheSpec

# A leading block found in the cache: on the device, or in a tier below it.
Hit = KVBlock | TierHit


def commit_ttls(*, num_prompt_tokens: int, block_size: int, cache: CacheSpec, default_ttl_s: int) -> list[int]:
    """The TTL of each block this prompt may commit, from block 0.

    Only full blocks before the last region's end are committed, and never the block
    holding the last prompt token (it is always recomputed for the first logits). A
    block gets the longest TTL of the regions that cover it whole.
    """
    max_blocks = (num_prompt_tokens - 1) // block_size
    if cache.regions is None:
        return [default_ttl_s] * max_blocks
    ttls = []
    for j in range(max_blocks):
        end = (j + 1) * block_size
        covering = [r.ttl_s for r in cache.regions if r.end >= end]
        if not covering:
            break
        ttls.append(max(covering))
    return ttls


def split_points(*, num_prompt_tokens: int, block_size: int, cache: CacheSpec, commit_blocks: int) -> list[int]:
    """Where prefill passes must end: wherever a cached prefix of this prompt may end.

    That is the last full block of every region, as this prompt commits it, and as a
    prompt ending at the region's end would (it never commits the block holding its
    last token); and the end of this request's commits. A later request that hits up
    to any of these points then repeats the very passes this one ran from there on,
    on the KV it stored, so its output is the same.
    """
    last = (num_prompt_tokens - 1) // block_size
    points = {commit_blocks * block_size}
    for region in cache.regions or ():
        for end in (region.end, region.end - 1):
            points.add(min(max(end, 0) // block_size, last) * block_size)
    return sorted(p for p in points if p > 0)


class KVCacheManager:
    def __init__(self, *, pool: BlockPool, hasher: BlockHasher, clock: Clock, tiers: TierManager | None = None) -> None:
        self.pool = pool
        self.hasher = hasher
        self.clock = clock
        self.tiers = tiers
        self.block_size = hasher.block_size
        # Prometheus-style counters, in tokens, as vLLM's prefix_cache_queries/hits.
        self.num_query_tokens = 0
        self.num_hit_tokens = 0
        self.num_hit_tokens_by_tier = dict.fromkeys(TIER_NAMES, 0)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_hits(self, request: Request) -> list[Hit]:
        """The longest run of the request's leading blocks found live, each in the fastest tier holding it."""
        now = self.clock.now()
        limit = min(len(request.block_hashes), (request.num_tokens - 1) // self.block_size)
        bs = self.block_size
        keys = [(request.block_hashes[j], request.prompt_token_ids[j * bs : (j + 1) * bs]) for j in range(limit)]
        # Below the device, looked up as the walk gets there (a remote tier: a chunk per round trip).
        below = self.tiers.lookup_prefix(keys, now) if self.tiers is not None else None
        hits: list[Hit] = []
        for j, (block_hash, tokens) in enumerate(keys):
            hit: Hit | None = self.pool.get_cached(block_hash, tokens, now)
            if hit is None and below is not None:
                hit = below.get(j)
            if hit is None:
                break
            hits.append(hit)
        return hits

    def prefetch(self, hits: list[Hit]) -> bool:
        """Start fetching the hits held by a remote tier; True when admit() would not wait for any."""
        below = [h for h in hits if isinstance(h, TierHit)]
        return not below or self.tiers is None or self.tiers.prefetch(below)

    def admit(self, request: Request, hits: list[Hit], num_new_tokens: int) -> bool:
        """Take the request's prefix hits (from find_hits) and blocks for its first chunk.

        Hits from lower tiers are loaded into fresh device blocks here, before any
        prefill. False, changing no request state, when the pool cannot hold the
        chunk, or when a lower-tier hit is gone or fails verification (it is dropped,
        so the next find_hits stops before it). num_new_tokens counts from the end of
        the hits.
        """
        assert not request.blocks and request.num_computed_tokens == 0
        num_hit_tokens = len(hits) * self.block_size
        on_device = [h for h in hits if isinstance(h, KVBlock)]
        below = [h for h in hits if isinstance(h, TierHit)]
        needed = self.blocks_needed(num_hit_tokens + num_new_tokens) - len(on_device)
        free_after_touch = self.pool.num_free - sum(1 for b in on_device if b.ref_count == 0)
        if needed > free_after_touch:
            return False
        if below and not self._lock(below):
            return False
        now = self.clock.now()
        ttls = [request.commit_ttls[j] if j < len(request.commit_ttls) else 0 for j in range(len(hits))]
        self.pool.touch(on_device, [t for h, t in zip(hits, ttls, strict=True) if isinstance(h, KVBlock)], now)
        if on_device and self.tiers is not None and self.tiers.shared:
            self.tiers.share(on_device)  # their life here just grew: so does the shared copy's
        fresh: list[KVBlock] = []
        try:
            fresh = self.pool.allocate(needed, now)
            promoted = iter(fresh[: len(below)])
            blocks = [h if isinstance(h, KVBlock) else next(promoted) for h in hits]
            loaded = not below or self._promote(request, hits, blocks, ttls, now)
        except BaseException:
            # Leave the pool as it was: a request that fails here must not keep blocks.
            self.pool.release([*on_device, *fresh], now)
            raise
        if not loaded:
            self.pool.release([*on_device, *fresh], now)
            return False
        request.blocks = [*blocks, *fresh[len(below) :]]
        request.num_computed_tokens = num_hit_tokens
        request.num_committed_blocks = len(hits)
        if request.num_cached_tokens is None:
            # Reads are counted once, at the first admission: these are the tokens whose
            # prefill this request really skipped. Re-admissions after preemption are ours.
            by_tier = tier_counts(hits, self.block_size)
            request.num_cached_tokens = num_hit_tokens
            request.cached_by_tier = by_tier
            request.num_accounted_blocks = len(hits)
            self.num_query_tokens += request.num_prompt_tokens
            self.num_hit_tokens += num_hit_tokens
            for tier, tokens in by_tier.items():
                self.num_hit_tokens_by_tier[tier] = self.num_hit_tokens_by_tier.get(tier, 0) + tokens
        return True

    def _lock(self, below: list[TierHit]) -> bool:
        assert self.tiers is not None
        return self.tiers.lock(below)

    def _promote(self, request: Request, hits: list[Hit], blocks: list[KVBlock], ttls: list[int], now: float) -> bool:
        """Load the lower-tier hits into their fresh device blocks and commit them there."""
        assert self.tiers is not None
        moves = [(j, h, b) for j, (h, b) in enumerate(zip(hits, blocks, strict=True)) if isinstance(h, TierHit)]
        if not self.tiers.load([h for _, h, _ in moves], [b.block_id for _, _, b in moves]):
            return False
        bs = self.block_size
        for j, hit, block in moves:
            ttl = max(hit.entry.ttl_s, ttls[j])
            # False only if a block with this hash but other tokens (a hash collision) is live on
            # the device: this block then serves this request without being cached.
            tokens = request.prompt_token_ids[j * bs : (j + 1) * bs]
            self.pool.commit(block, request.block_hashes[j], tokens, ttl, now, parent_of(request, j))
        return True

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Grow the request's blocks to hold num_new_tokens more tokens; False if the pool is short."""
        needed = self.blocks_needed(request.num_computed_tokens + num_new_tokens) - len(request.blocks)
        if needed <= 0:
            return True
        if needed > self.pool.num_free:
            return False
        request.blocks.extend(self.pool.allocate(needed, self.clock.now()))
        return True

    def commit_computed(self, request: Request) -> None:
        """Commit the committable full blocks whose KV is now computed, and count the new writes."""
        bs = self.block_size
        upto = min(len(request.commit_ttls), request.num_computed_tokens // bs)
        now = self.clock.now()
        for j in range(request.num_committed_blocks, upto):
            ttl = request.commit_ttls[j]
            tokens = request.prompt_token_ids[j * bs : (j + 1) * bs]
            block_hash = request.block_hashes[j]
            committed = self.pool.commit(request.blocks[j], block_hash, tokens, ttl, now, parent_of(request, j))
            if committed and self.tiers is not None and self.tiers.shared:
                self.tiers.share([request.blocks[j]])
            # A block recomputed after a preemption was already counted the first time.
            if committed and j >= request.num_accounted_blocks:
                request.write_tokens_by_ttl[ttl] = request.write_tokens_by_ttl.get(ttl, 0) + bs
        request.num_committed_blocks = max(request.num_committed_blocks, upto)
        request.num_accounted_blocks = max(request.num_accounted_blocks, upto)

    def free(self, request: Request) -> None:
        """Release the request's blocks; committed ones stay cached for later hits."""
        self.pool.release(request.blocks, self.clock.now())
        request.blocks = []

    def slot_ids(self, request: Request, start: int, end: int) -> list[int]:
        """Flat pool slots (block_id * block_size + offset) of positions [start, end)."""
        bs = self.block_size
        blocks = request.blocks
        return [blocks[p // bs].block_id * bs + p % bs for p in range(start, end)]

    @staticmethod
    def block_ids(blocks: Sequence[KVBlock]) -> list[int]:
        return [b.block_id for b in blocks]


def parent_of(request: Request, j: int) -> BlockHash | None:
    """The hash block j chains on: the previous block's; None for the first."""
    return request.block_hashes[j - 1] if j > 0 else None


def tier_counts(hits: Sequence[Hit], block_size: int) -> dict[str, int]:
    """Hit tokens by the tier each block was found in, every tier name present (zeros included)."""
    counts = dict.fromkeys(TIER_NAMES, 0)
    for hit in hits:
        name = hit.tier.name if isinstance(hit, TierHit) else DEVICE
        counts[name] = counts.get(name, 0) + block_size
    return counts
