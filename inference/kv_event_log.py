"""The engine's KV event log: what its media store and drop, batched per step, with a mirror for snapshots.

The device pool and the tiers call `stored` and `removed` as blocks come and go (the
`BlockEvents` protocol). Each call appends to a pending list under a lock (the disk tier's
writer thread reports too) and updates a mirror, medium + hash -> (ttl, expiry, parent), of
what the published events say is live. `flush()`, once per engine step, turns the pending
events into one `KVEventBatch` with the next `seq` and hands it to the sink (the NATS
publisher) under the same lock, so batches reach the sink in seq order and `snapshot()`
(the mirror, after a flush) is exactly the replay of batches 1..seq.

Expiry: blocks expire lazily in the engine (a lookup drops an expired block). `sweep()`
makes expiry visible: a heap orders the published expiries; when one comes due, the block's
medium is asked for the block's current expiry (a `Probe`): gone or expired -> BlockRemoved;
extended (a device block still in use, or released after its commit, or a tier entry
refreshed) -> BlockStored again with the later expiry, a little before the old one passes,
so a router never forgets a block that is still live. Expiry only moves forward, so a block
reported removed can never be a hit later unless a new BlockStored says so.

Token ids never enter the log: BlockStored.token_ids is always empty.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import msgspec

from inference.hashing import BlockHash
from kvgate.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    KVSnapshot,
    SnapshotBlock,
)

# The event medium of each tier, by tier name; other names are upper-cased.
TIER_MEDIA = {"host": "HOST", "disk": "DISK", "redis": "REMOTE"}

# A batch holds at most this many hashes (~150 kB of msgpack with 32-byte hashes), so that a step
# that moves many blocks (a mass expiry, the disk's blocks at start-up) stays within NATS's
# 1 MB message limit: it goes out as several batches, with consecutive seqs.
MAX_HASHES_PER_BATCH = 4096

# (block hash, now) -> the block's current expiry in that medium (epoch s), or None if it is gone.
Probe = Callable[[BlockHash, float], float | None]
Sink = Callable[[KVEventBatch], None]


def tier_medium(tier_name: str) -> str:
    """The event medium a tier's blocks are reported under ("host" -> "HOST", "redis" -> "REMOTE")."""
    return TIER_MEDIA.get(tier_name, tier_name.upper())


def split_events(events: list[KVEvent], max_hashes: int) -> list[list[KVEvent]]:
    """events in order, cut into parts of at most max_hashes block hashes each (an event cut in two
    keeps its chain: the second piece's parent is the first piece's last hash)."""
    parts: list[list[KVEvent]] = []
    part: list[KVEvent] = []
    size = 0
    for event in events:
        if isinstance(event, AllBlocksCleared):
            part.append(event)
            continue
        hashes, start = event.block_hashes, 0
        while start < len(hashes):
            if size == max_hashes:
                parts.append(part)
                part, size = [], 0
            piece = hashes[start : start + max_hashes - size]
            if len(piece) == len(hashes):
                part.append(event)
            elif isinstance(event, BlockStored):
                parent = event.parent_block_hash if start == 0 else hashes[start - 1]
                part.append(msgspec.structs.replace(event, block_hashes=piece, parent_block_hash=parent))
            else:
                part.append(msgspec.structs.replace(event, block_hashes=piece))
            size += len(piece)
            start += len(piece)
    if part:
        parts.append(part)
    return parts


class BlockEvents(Protocol):
    """Where the device pool and the tiers report their blocks (implemented by KVEventLog)."""

    def stored(
        self, medium: str, block_hash: BlockHash, parent: BlockHash | None, ttl_s: int, expires_at: float
    ) -> None:
        """The block is live in medium until expires_at (again: a later expiry is a refresh)."""
        ...

    def removed(self, medium: str, block_hash: BlockHash) -> None:
        """The block left medium (evicted, uncached, expired, dropped)."""
        ...


class LiveBlock(NamedTuple):
    ttl_s: int
    expires_at: float
    parent: BlockHash | None


class KVEventLog:
    """Collects one engine's KV events; thread-safe. Starts with AllBlocksCleared pending."""

    def __init__(
        self,
        *,
        engine_id: str,
        block_size: int,
        sink: Sink | None = None,
        sweep_interval_s: float = 1.0,
        refresh_margin_s: float = 2.0,
        max_hashes_per_batch: int = MAX_HASHES_PER_BATCH,
    ) -> None:
        self.engine_id = engine_id
        self.block_size = block_size
        self.sweep_interval_s = sweep_interval_s
        self.refresh_margin_s = refresh_margin_s
        self.max_hashes_per_batch = max_hashes_per_batch
        self._sink = sink
        self._lock = threading.Lock()
        self._pending: list[KVEvent] = []
        self._live: dict[tuple[str, BlockHash], LiveBlock] = {}
        # (when to look at it, medium, hash, the expiry published): entries whose expiry
        # no longer matches the mirror are stale and skipped.
        self._due: list[tuple[float, str, BlockHash, float]] = []
        self._seq = 0
        self._next_sweep = -math.inf
        self.cleared()

    def set_sink(self, sink: Sink | None) -> None:
        with self._lock:
            self._sink = sink

    @property
    def seq(self) -> int:
        """The seq of the last batch made."""
        return self._seq

    def __len__(self) -> int:
        """Blocks the published events say are live, over all media."""
        return len(self._live)

    # -- reporting (any thread) -----------------------------------------------------------

    def stored(
        self, medium: str, block_hash: BlockHash, parent: BlockHash | None, ttl_s: int, expires_at: float
    ) -> None:
        with self._lock:
            self._stored(medium, block_hash, parent, ttl_s, expires_at)

    def _stored(
        self, medium: str, block_hash: BlockHash, parent: BlockHash | None, ttl_s: int, expires_at: float
    ) -> None:
        key = (medium, block_hash)
        live = self._live.get(key)
        if live is not None:
            if live.expires_at >= expires_at and live.ttl_s >= ttl_s:
                return  # nothing new to say
            parent = parent if parent is not None else live.parent
        self._live[key] = LiveBlock(ttl_s, expires_at, parent)
        margin = min(self.refresh_margin_s, ttl_s / 2)
        heapq.heappush(self._due, (expires_at - margin, medium, block_hash, expires_at))
        last = self._pending[-1] if self._pending else None
        if (
            type(last) is BlockStored
            and parent is not None
            and last.block_hashes[-1] == parent
            and last.medium == medium
            and last.ttl_s == ttl_s
            and last.expires_at == expires_at
        ):
            last.block_hashes.append(block_hash)  # the next block of the same chain: one event
            return
        self._pending.append(
            BlockStored(
                block_hashes=[block_hash],
                parent_block_hash=parent,
                token_ids=[],
                block_size=self.block_size,
                medium=medium,
                ttl_s=ttl_s,
                expires_at=expires_at,
            )
        )

    def removed(self, medium: str, block_hash: BlockHash) -> None:
        with self._lock:
            self._removed(medium, block_hash)

    def _removed(self, medium: str, block_hash: BlockHash) -> None:
        if self._live.pop((medium, block_hash), None) is None:
            return  # never reported, or reported removed already (an expired block dropped late)
        last = self._pending[-1] if self._pending else None
        if type(last) is BlockRemoved and last.medium == medium:
            last.block_hashes.append(block_hash)
        else:
            self._pending.append(BlockRemoved(block_hashes=[block_hash], medium=medium))

    def cleared(self) -> None:
        """Everything is gone (start-up, a reset)."""
        with self._lock:
            self._pending.append(AllBlocksCleared())
            self._live.clear()
            self._due.clear()

    # -- the engine thread ------------------------------------------------------------------

    def tick(self, now: float, probes: Mapping[str, Probe]) -> KVEventBatch | None:
        """Once per engine step or idle wait: sweep expiries (every sweep_interval_s of the clock), then flush."""
        if now >= self._next_sweep:
            self._next_sweep = now + self.sweep_interval_s
            self.sweep(now, probes)
        return self.flush()

    def sweep(self, now: float, probes: Mapping[str, Probe]) -> None:
        """Report the blocks whose published expiry has come: removed, or stored again if extended.

        Probes run outside the lock (the disk's takes the disk mutex, whose holder may be
        reporting); a block reported on meanwhile is left to that newer report.
        """
        with self._lock:
            due = []
            while self._due and self._due[0][0] <= now:
                due.append(heapq.heappop(self._due))
            self._compact()
        for _, medium, block_hash, published in due:
            live = self._live.get((medium, block_hash))
            if live is None or live.expires_at != published:
                continue
            probe = probes.get(medium)
            current = probe(block_hash, now) if probe is not None else published
            with self._lock:
                live = self._live.get((medium, block_hash))
                if live is None or live.expires_at != published:
                    continue
                if current is None or current <= now:
                    self._removed(medium, block_hash)
                elif current > published:
                    self._stored(medium, block_hash, live.parent, live.ttl_s, current)
                else:  # not extended and not expired yet: look again when it expires
                    heapq.heappush(self._due, (current, medium, block_hash, published))

    def _compact(self) -> None:
        # Stale heap entries (blocks removed or refreshed before their expiry) pile up
        # under churn; rebuild from the mirror when they dominate.
        if len(self._due) > 4 * len(self._live) + 1024:
            self._due = [
                (live.expires_at - min(self.refresh_margin_s, live.ttl_s / 2), medium, block_hash, live.expires_at)
                for (medium, block_hash), live in self._live.items()
            ]
            heapq.heapify(self._due)

    def flush(self) -> KVEventBatch | None:
        """The pending events as the next batch, handed to the sink; None when there are none."""
        if not self._pending:  # unlocked peek: a report racing it goes into the next flush
            return None
        with self._lock:
            return self._flush()

    def _flush(self) -> KVEventBatch | None:
        if not self._pending:
            return None
        events, self._pending = self._pending, []
        batch = None
        for part in split_events(events, self.max_hashes_per_batch):
            self._seq += 1
            batch = KVEventBatch(ts=time.time(), events=part, seq=self._seq, engine_id=self.engine_id)
            if self._sink is not None:
                self._sink(batch)  # under the lock: batches reach the sink in seq order
        return batch

    # -- readers (any thread) ------------------------------------------------------------

    def snapshot(self) -> KVSnapshot:
        """Every block the events say is live, as of the last batch (pending events are flushed first)."""
        with self._lock:
            self._flush()
            seq = self._seq
            items = list(self._live.items())
        blocks = [SnapshotBlock(h.hex(), medium, live.expires_at) for (medium, h), live in items]
        return KVSnapshot(engine_id=self.engine_id, seq=seq, blocks=blocks)
