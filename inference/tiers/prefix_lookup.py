"""Looking up one request's leading blocks in the tiers, with one round trip per chunk for remote tiers.

find_hits walks a request's blocks in order and stops at the first one found nowhere.
Local tiers answer block by block. A tier with lookup_many (base.BatchedLookup) is
asked, the first time find_hits reaches it, for the blocks from there on: it answers a
chunk of them in one round trip, and is asked again only if the walk gets past that
chunk. A prefix found on the device never reaches the remote tier at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from inference.hashing import BlockHash
from inference.tiers.base import BatchedLookup, KVTier
from inference.tiers.lru_index import TierEntry

if TYPE_CHECKING:
    from inference.tiers.tier_manager import TierHit


class PrefixLookup:
    def __init__(self, tiers: Sequence[KVTier], keys: Sequence[tuple[BlockHash, Sequence[int]]], now: float) -> None:
        self.tiers = tiers
        self.keys = keys
        self.now = now
        # Per batched tier: block index -> its answer, for the chunks asked so far.
        self._answers: dict[int, dict[int, TierEntry | None]] = {
            id(t): {} for t in tiers if isinstance(t, BatchedLookup)
        }

    def get(self, j: int) -> TierHit | None:
        """Block j in the fastest tier holding it live, with exactly its token ids."""
        from inference.tiers.tier_manager import TierHit

        block_hash, tokens = self.keys[j]
        for tier in self.tiers:
            answers = self._answers.get(id(tier))
            if answers is None:
                entry = tier.lookup(block_hash, tokens, self.now)
            else:
                if j not in answers:
                    found = tier.lookup_many(self.keys[j:], self.now)  # type: ignore[attr-defined]
                    answers.update(zip(range(j, j + len(found)), found, strict=True))
                entry = answers[j]
            if entry is not None:
                return TierHit(tier, entry)
        return None
