"""What a KV tier below the device pool is: the interface TierManager drives, tier by tier.

Modelled on vLLM's offloading manager (lookup, prepare_load, touch, complete_load,
prepare_store, complete_store), at the grain of one whole block (`layout.BlockLayout`)
described by a `TierEntry`:

- read path: `lookup` per block; for a promotion `prepare_load` (lock the entries),
  `load` each into its device block, `complete_load` (unlock, drop what failed), and
  `touch` if the whole promotion succeeded;
- write path: `refresh` (the block is here already: take the longer TTL, later expiry,
  newer use) else `store` (copy it in now, or queue the copy). A tier that has to evict
  a live entry to make room hands it to `demote`, which keeps it in the tiers below.

A tier is owned by one engine thread; only what it says about threads in its own doc
(the disk tier's writer thread and mutex) goes beyond that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from inference.clock import Clock
from inference.hashing import BlockHash
from inference.tiers.layout import BlockLayout
from inference.tiers.lru_index import TierEntry
from inference.tiers.stats import TierStats

if TYPE_CHECKING:
    from inference.settings import EngineSettings

# Keep an evicted live block below: its metadata (detached from the evicting tier) and its data.
Demote = Callable[[TierEntry, torch.Tensor], None]


@runtime_checkable
class KVTier(Protocol):
    name: str
    """Its label in usage (`cached_tokens_by_tier`) and in metrics (`tier="..."`)."""
    shared: bool
    """Whether other engines read and write it too (a remote store); host and disk belong to one engine."""
    persistent: bool
    """Whether its blocks survive a restart: the engine writes the blocks above it out to it at shutdown."""
    layout: BlockLayout
    stats: TierStats

    @property
    def capacity(self) -> int:
        """How many blocks it holds at most."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, block_hash: BlockHash) -> bool: ...

    @property
    def num_pending_stores(self) -> int:
        """Blocks accepted by store() and not yet stored (0 for a tier that stores at once)."""
        ...

    # -- read path ----------------------------------------------------------------------

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> TierEntry | None:
        """The live entry holding exactly token_ids under block_hash; an expired one is dropped."""
        ...

    def prepare_load(self, entries: Sequence[TierEntry]) -> bool:
        """Lock entries (from lookup) against eviction until complete_load; False, locking none, if one is gone."""
        ...

    def load(self, entry: TierEntry, dest: torch.Tensor) -> bool:
        """Copy a locked entry's block into dest (a device block); False if it fails verification."""
        ...

    def complete_load(self, entries: Sequence[TierEntry], *, failed: Sequence[TierEntry] = ()) -> None:
        """Undo prepare_load; the entries in failed are dropped from the tier."""
        ...

    def touch(self, entries: Sequence[TierEntry]) -> None:
        """Mark loaded entries most recently used, in this order."""
        ...

    # -- write path ---------------------------------------------------------------------

    def refresh(self, entry: TierEntry) -> bool:
        """If the block is stored already, take entry's longer TTL, later expiry and newer use: True."""
        ...

    def store(self, entry: TierEntry, source: torch.Tensor, *, now: float, demote: Demote | None) -> bool:
        """Store a block not held here, copying source before returning (its slot is about to be reused).

        False if there is no room (every candidate victim is being loaded). A live victim
        evicted to make room goes to demote, when there are tiers below.
        """
        ...

    def write_out_blocks(self, now: float) -> Iterator[tuple[TierEntry, torch.Tensor]]:
        """At shutdown: the live blocks a restart would lose, least recently used first (none if persistent)."""
        ...

    # -- lifecycle ----------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every store accepted so far is done."""
        ...

    def close(self) -> None:
        """Finish pending stores, persist what must be, release resources."""
        ...


@runtime_checkable
class BatchedLookup(Protocol):
    """Optional, for a tier where each call is a round trip (a remote store): look up a run of blocks at once.

    TierManager.lookup_prefix uses it, when a tier has it, for the consecutive blocks of
    one request; lookup() still serves single blocks.
    """

    def lookup_many(self, keys: Sequence[tuple[BlockHash, Sequence[int]]], now: float) -> list[TierEntry | None]:
        """What lookup() would return for each of a leading part of keys (at least one), in one round trip."""
        ...


@runtime_checkable
class Prefetching(Protocol):
    """Optional, for a tier whose loads wait on the network: start them early, so other work runs meanwhile."""

    def prefetch(self, entries: Sequence[TierEntry]) -> bool:
        """Start fetching entries (from lookup) if not started; True when all are in and load() will not wait."""
        ...


class KVTierType(Protocol):
    """A tier class: builds its tier from the engine settings, or None when they turn it off."""

    name: str

    def from_settings(
        self, settings: EngineSettings, layout: BlockLayout, *, clock: Clock, pin_memory: bool, model_fingerprint: str
    ) -> KVTier | None:
        """model_fingerprint (inference.model_fingerprint) names the KV this engine computes, for a shared tier."""
        ...
