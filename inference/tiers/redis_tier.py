"""The shared KV tier in Redis: blocks every engine of the same model reads and writes.

Key: kvg:v2:{model fingerprint}:{layout fingerprint}:{block size}:{record name hex}.
The model fingerprint (inference.model_fingerprint) makes two engines share blocks only
when they would compute the same bytes; the layout fingerprint carries dtype, shape and
LAYOUT_VERSION, as on disk; the record name (sealing.TierKeys.name) is a keyed hash of
the salted chained block hash, so tenants' keys differ (the salt is in the first block's
hash) and no key name lets anyone without the tier key confirm a guessed prompt.

Value: a sealed header (disk_format.RecordHeader: layout, block hash, TTL, token ids,
the payload's nonce and tag, all encrypted) padded to 64 bytes, then the block's KV
bytes, encrypted (AES-256-GCM under a key of the record's own, disk_format). A lookup
reads the header only, opens it (its name must be the key it was read under, so a value
copied under another block's or tenant's key does not open) and checks the token ids
exactly, as every tier does; a load opens the payload. A value that does not open
(forged, damaged, truncated, under an unknown key) is a miss: counted in
checksum_failures, logged at a bounded rate, deleted, and recomputed.

Key rotation (KVGATE_KV_TIER_PREVIOUS_KEYS): a lookup also tries each previous key's
name for a block; a hit there loads from that key, and the next share() stores the
block under the current key (the refresh of the current name finds nothing), so hot
blocks move over while the old ones expire.

Round trips, each a pipeline of up to chunk_blocks blocks:
- lookup_many: GETRANGE (the header) + PTTL per block. Nothing is refreshed: the request
  may still be cut short or fail to get device blocks.
- prefetch / prepare_load: `GETEX key PX ttl` per block on the reader thread, chunk by
  chunk; a hit refreshes the key's expiry to its TTL from now (never below what it had).
  The scheduler calls prefetch() before admitting a request with hits here and, while
  they are on their way, runs its step for the other requests (their decodes and
  prefills overlap the transfer); the request is admitted at a later step. An engine
  with nothing else to do admits at once and waits in load(). load() waits only for its
  own block's chunk, so verifying and copying one chunk overlaps the transfer of the
  next, and the transfers overlap the host and disk tiers' loads, which TierManager
  makes first. The request's own prefill starts once its whole prefix is in.
- stores: `SET key value NX PX ttl` + `PEXPIRE key ttl GT` per block, from a writer
  thread with a bounded queue (RedisWriter); NX keeps the first writer's bytes (every
  writer computed the same bytes), GT lets a longer TTL win. refresh() sends PEXPIRE GT
  alone: GETEX would move the value over the network and could shorten the expiry.

KV events (attach_events): under the medium "REMOTE", this engine reports the keys it knows
of (stored, found by a lookup, refreshed: BlockStored with the expiry it knows) and those it
finds gone (BlockRemoved); expiry() tells the event log's sweep what it knows now. Routers count
these blocks as readable by every engine with the tier, whichever engine reported them.

Redis down or slow is a miss, never an error: every call has a short socket timeout,
no retries, and a circuit breaker skips calls for a growing backoff after a failure.
Failures and skips are counted in stats (errors, skipped).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import redis
import structlog
import torch
from redis.backoff import NoBackoff
from redis.retry import Retry

from inference.clock import Clock
from inference.hashing import BlockHash
from inference.tiers.base import Demote
from inference.tiers.circuit_breaker import CircuitBreaker
from inference.tiers.disk_format import RecordHeader, header_size, open_payload, seal_payload
from inference.tiers.layout import BlockLayout
from inference.tiers.lru_index import TierEntry
from inference.tiers.redis_writer import RedisWriter, RefreshJob, StoreJob, WriteJob
from inference.tiers.sealing import RejectLog, TierKeys
from inference.tiers.stats import TierStats
from inference.tiers.transfer import copy_block, wait

if TYPE_CHECKING:
    from inference.kv_event_log import BlockEvents
    from inference.settings import EngineSettings

log = structlog.get_logger(__name__)

T = TypeVar("T")
KEY_VERSION = "kvg:v2"  # v2: sealed records under keyed names (v1 values were plaintext)
_HEADER_ALIGN = 64  # the payload starts aligned, so it can be viewed as any KV dtype in place
_PREFETCH_KEEP_S = 60.0  # fetched blocks no admission took are dropped after this long
_REFRESH_LAG_S = 60.0  # the most a shared copy's expiry may lag this engine's, to save PEXPIREs


def key_prefix(model_fingerprint: str, layout: BlockLayout) -> str:
    """Every key of this model and layout starts with this (then ":" and the block hash in hex)."""
    return f"{KEY_VERSION}:{model_fingerprint}:{layout.fingerprint}:{layout.block_size}"


class RedisTier:
    """Blocks in Redis, shared by engines; this engine only indexes the keys it knows of (see the module doc)."""

    name = "redis"
    shared = True
    persistent = True  # its blocks outlive the engine

    def __init__(
        self,
        client: redis.Redis,
        layout: BlockLayout,
        *,
        model_fingerprint: str,
        clock: Clock,
        capacity: int,
        chunk_blocks: int = 32,
        queue_blocks: int = 256,
        timeout_s: float = 0.5,
        breaker: CircuitBreaker | None = None,
        pin_memory: bool = False,
        keys: TierKeys | None = None,
    ) -> None:
        assert capacity > 0 and chunk_blocks > 0
        self.client = client
        # None: this process's random key (tests and tools; the engine passes TierKeys.from_settings).
        self.keys = keys if keys is not None else TierKeys.process_keys()
        self.layout = layout
        self.clock = clock
        self.prefix = key_prefix(model_fingerprint, layout)
        self.chunk_blocks = chunk_blocks
        self.timeout_s = timeout_s
        self.breaker = breaker or CircuitBreaker()
        self.stats = TierStats()
        self._capacity = capacity
        self._header_size = header_size(layout.block_size)
        self.payload_offset = -(-self._header_size // _HEADER_ALIGN) * _HEADER_ALIGN
        self._layout_key = int(layout.fingerprint, 16)
        self._lock = threading.Lock()  # guards stats and _known (engine, reader and writer threads)
        # Keys this engine stored or found, with their expiry on the engine's clock: what
        # refresh() can extend without a round trip, and what len() reports.
        self._known: OrderedDict[BlockHash, float] = OrderedDict()
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-redis-read")
        # Fetches started (by prefetch or prepare_load) and not yet loaded: block hash ->
        # (its chunk's GETEX replies, its index there, when the fetch started).
        self._loads: dict[BlockHash, tuple[Future[list[bytes | None] | None], int, float]] = {}
        self._corrupt: set[BlockHash] = set()
        # Hits found under a previous key's name (rotation), by block: where their load must read.
        self._found_under: OrderedDict[BlockHash, str] = OrderedDict()
        self._rejects = RejectLog("kv_redis_record_rejected")
        # A CUDA device's loads go through it (pinned, like the staging buffers).
        self._read_buffer = torch.empty(layout.nbytes, dtype=torch.uint8, pin_memory=pin_memory)
        # Values on their way to Redis, allocated once (a fresh buffer per block costs page
        # faults on the engine thread); every queued store holds one, so this bounds the queue.
        value_size = self.payload_offset + layout.nbytes
        self._staging = torch.empty((queue_blocks, value_size), dtype=torch.uint8, pin_memory=pin_memory)
        self._free_buffers = list(range(queue_blocks))
        self.writer = RedisWriter(self._write, max_queued=queue_blocks, batch_size=chunk_blocks)
        self._closed = False
        self.events: BlockEvents | None = None
        self.medium = "REMOTE"

    @classmethod
    def from_settings(
        cls, settings: EngineSettings, layout: BlockLayout, *, clock: Clock, pin_memory: bool, model_fingerprint: str
    ) -> RedisTier | None:
        """KVGATE_KV_REDIS_URL (unset: None) and its KVGATE_KV_REDIS_* sizes and timeout."""
        if not settings.kv_redis_url:
            return None
        timeout_s = settings.kv_redis_timeout_ms / 1000
        # Not the URL: it may hold a password.
        log.info("kv_redis_tier", key_prefix=key_prefix(model_fingerprint, layout))
        return cls(
            connect(settings.kv_redis_url, timeout_s),
            layout,
            model_fingerprint=model_fingerprint,
            clock=clock,
            capacity=max(1, int(settings.kv_redis_gib * 2**30) // layout.nbytes),
            chunk_blocks=settings.kv_redis_chunk_blocks,
            queue_blocks=max(1, int(settings.kv_redis_queue_mib * 2**20) // layout.nbytes),
            timeout_s=timeout_s,
            pin_memory=pin_memory,
            keys=TierKeys.from_settings(settings),
        )

    def key(self, block_hash: BlockHash, key_id: int | None = None) -> str:
        """The block's Redis key under a tier key (default: the current one, which every write uses)."""
        name = self.keys.name(self.keys.current_id if key_id is None else key_id, block_hash)
        return f"{self.prefix}:{name.hex()}"

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._known)

    def __contains__(self, block_hash: BlockHash) -> bool:
        with self._lock:
            return block_hash in self._known

    @property
    def num_pending_stores(self) -> int:
        return self.writer.num_pending

    # -- KV events --------------------------------------------------------------------------

    def attach_events(self, events: BlockEvents, medium: str) -> None:
        """Report the keys this engine knows of to events from now on, starting with those it knows already."""
        now = self.clock.now()
        with self._lock:
            self.events, self.medium = events, medium
            known = list(self._known.items())
        for block_hash, expires_at in known:
            if expires_at > now:
                events.stored(medium, block_hash, None, max(int(expires_at - now), 1), expires_at)

    def expiry(self, block_hash: BlockHash, now: float) -> float | None:
        """The key's expiry as this engine knows it, or None when it knows of no such key."""
        with self._lock:
            return self._known.get(block_hash)

    # -- read path ----------------------------------------------------------------------

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> TierEntry | None:
        return self.lookup_many([(block_hash, token_ids)], now)[0]

    def lookup_many(self, keys: Sequence[tuple[BlockHash, Sequence[int]]], now: float) -> list[TierEntry | None]:
        """The entries of the first chunk_blocks of keys, in one round trip (headers and PTTLs only).

        Each block is looked up under the name of every key that may read (the current one
        first); with no previous keys configured that is one name, as many commands as before.
        """
        keys = keys[: self.chunk_blocks]
        key_ids = self.keys.read_ids
        names = [[self.key(block_hash, key_id) for key_id in key_ids] for block_hash, _ in keys]

        def send() -> list[object]:
            pipe = self.client.pipeline(transaction=False)
            for block_names in names:
                for key in block_names:
                    pipe.getrange(key, 0, self._header_size - 1)
                    pipe.pttl(key)
            return pipe.execute()

        replies = self._call(send)
        if replies is None:
            return [None] * len(keys)
        per_block = 2 * len(key_ids)
        entries: list[TierEntry | None] = []
        for i, (block_hash, tokens) in enumerate(keys):
            found = replies[i * per_block : (i + 1) * per_block]
            candidates = [(names[i][j], found[2 * j], found[2 * j + 1]) for j in range(len(key_ids))]
            entries.append(self._entry(block_hash, tokens, candidates, now))  # type: ignore[arg-type]
        return entries

    def _entry(
        self, block_hash: BlockHash, tokens: Sequence[int], candidates: list[tuple[str, bytes, int]], now: float
    ) -> TierEntry | None:
        """The block's entry from the first of its candidate keys (name, header, PTTL) that holds a record."""
        for key, header, pttl in candidates:
            if pttl == -2 or not header:  # no such key (never stored, expired, or evicted by Redis)
                continue
            parsed = self._open_header(header, key, block_hash)
            if parsed is None:
                with self._lock:
                    self.stats.checksum_failures += 1
                self._rejects(tier=self.name, reason="header", key=key)
                self._delete(block_hash, key)
                continue
            if parsed.token_ids != tuple(tokens):  # a hash collision: not this block
                return None
            return self._hit(block_hash, key, parsed, pttl, now)
        self._forget(block_hash, evicted=True)
        return None

    def _open_header(self, header: bytes, key: str, block_hash: BlockHash) -> RecordHeader | None:
        """The header read under key, if it opens, names that key and matches this block and layout."""
        name = bytes.fromhex(key.rsplit(":", 1)[1])
        parsed = RecordHeader.unpack(header, block_size=self.layout.block_size, keys=self.keys, name=name)
        return parsed if parsed is not None and self._matches(parsed, block_hash) else None

    def _hit(self, block_hash: BlockHash, key: str, parsed: RecordHeader, pttl: int, now: float) -> TierEntry:
        if key != self.key(block_hash):  # under a previous key: its load reads there
            with self._lock:
                self._found_under[block_hash] = key
                self._found_under.move_to_end(block_hash)
                while len(self._found_under) > self._capacity:
                    self._found_under.popitem(last=False)
        expires_at = now + (pttl / 1000 if pttl >= 0 else parsed.ttl_s)
        entry = TierEntry(block_hash, parsed.token_ids, parsed.ttl_s, expires_at, now)
        self._remember(block_hash, expires_at, ttl_s=parsed.ttl_s)
        return entry

    def _matches(self, header: RecordHeader, block_hash: BlockHash) -> bool:
        return (
            header.block_hash == block_hash
            and header.layout == self._layout_key
            and header.payload_len == self.layout.nbytes
        )

    def prefetch(self, entries: Sequence[TierEntry]) -> bool:
        """Start fetching entries not on their way yet; True when every one is in (load() will not wait).

        The scheduler calls it before admitting a request with hits here, and while they
        are on their way runs a step for the other requests instead (docs/architecture.md).
        """
        self._start_fetches(entries)
        return all(self._loads[e.block_hash][0].done() for e in entries)

    def prepare_load(self, entries: Sequence[TierEntry]) -> bool:
        """Start fetching entries not prefetched yet (GETEX, refreshing their expiry), chunk by chunk.

        Nothing can be locked in a shared store: an entry gone by now fails its load().
        """
        self._start_fetches(entries)
        return True

    def _start_fetches(self, entries: Sequence[TierEntry]) -> None:
        started = time.monotonic()
        # Prefetches of requests that were never admitted (cancelled, or their hits changed).
        for block_hash in [h for h, (f, _, t) in self._loads.items() if f.done() and started - t > _PREFETCH_KEEP_S]:
            del self._loads[block_hash]
        missing = [e for e in entries if e.block_hash not in self._loads]
        now = self.clock.now()
        for start in range(0, len(missing), self.chunk_blocks):
            chunk = missing[start : start + self.chunk_blocks]
            # The hit's TTL from now, but never shorter than what the key had at lookup
            # (another engine may have extended it for a longer TTL).
            pxs = [max(e.ttl_s * 1000, int((e.expires_at - now) * 1000), 1) for e in chunk]
            keys = [self._read_key(e.block_hash) for e in chunk]
            future = self._reader.submit(self._fetch, keys, pxs)
            for i, entry in enumerate(chunk):
                self._loads[entry.block_hash] = (future, i, started)

    def _fetch(self, keys: list[str], pxs: list[int]) -> list[bytes | None] | None:
        def send() -> list[bytes | None]:
            pipe = self.client.pipeline(transaction=False)
            for key, px in zip(keys, pxs, strict=True):
                pipe.getex(key, px=px)
            return pipe.execute()

        return self._call(send)

    def load(self, entry: TierEntry, dest: torch.Tensor) -> bool:
        """Wait for the entry's chunk, verify the block and copy it into dest; False if gone or corrupt."""
        pending = self._loads.get(entry.block_hash)
        if pending is None:
            return False
        future, index, _ = pending
        try:
            values = future.result(timeout=4 * self.timeout_s + 1.0)
        except Exception as exc:  # timed out, or failed unexpectedly: a miss all the same
            with self._lock:
                self.stats.errors += 1
            log.warning("kv_redis_load_failed", error=repr(exc))
            return False
        value = values[index] if values is not None else None
        if value is None:  # gone since the lookup, or Redis failed
            return False
        # Decrypted into the read buffer, never into dest: dest is written only with a block that opened.
        if not self._open(entry, value, self._read_buffer.numpy()):
            with self._lock:
                self.stats.checksum_failures += 1
            self._rejects(tier=self.name, reason="payload", key=self._read_key(entry.block_hash))
            self._corrupt.add(entry.block_hash)
            return False
        if dest.device.type == "cpu":
            plain = self._read_buffer.numpy()
            np.copyto(_bits(dest), plain.view(_bits(dest).dtype).reshape(dest.shape))
        else:
            wait(copy_block(dest, self.layout.typed(self._read_buffer)))
        with self._lock:
            self.stats.loads += 1
            self.stats.bytes_read += self.layout.nbytes
        return True

    def _open(self, entry: TierEntry, value: bytes, out: np.ndarray) -> bool:
        """Open value (read under the entry's key) into out: its header, its token ids, then its payload."""
        if len(value) != self.payload_offset + self.layout.nbytes:
            return False
        header = self._open_header(value[: self._header_size], self._read_key(entry.block_hash), entry.block_hash)
        return (
            header is not None
            and header.token_ids == entry.token_ids
            and open_payload(self.keys, header, memoryview(value)[self.payload_offset :], out)
        )

    def _read_key(self, block_hash: BlockHash) -> str:
        """Where the block was found: a previous key's name, or (by default) the current one's."""
        with self._lock:
            return self._found_under.get(block_hash) or self.key(block_hash)

    def complete_load(self, entries: Sequence[TierEntry], *, failed: Sequence[TierEntry] = ()) -> None:
        """Forget the fetches; a failed entry is forgotten, and deleted from Redis if it was corrupt."""
        for entry in entries:
            self._loads.pop(entry.block_hash, None)
        for entry in failed:
            key = self._read_key(entry.block_hash)
            self._forget(entry.block_hash, evicted=True)
            if entry.block_hash in self._corrupt:
                self._corrupt.discard(entry.block_hash)
                self._delete(entry.block_hash, key)
        with self._lock:
            for entry in entries:
                self._found_under.pop(entry.block_hash, None)

    def touch(self, entries: Sequence[TierEntry]) -> None:
        """GETEX refreshed each key's expiry as it was read: note it in the local index."""
        now = self.clock.now()
        for entry in entries:
            self._remember(entry.block_hash, now + entry.ttl_s, ttl_s=entry.ttl_s, parent=entry.parent_hash)

    # -- write path ---------------------------------------------------------------------

    def refresh(self, entry: TierEntry) -> bool:
        """If this engine knows the key, extend its expiry to entry's (PEXPIRE GT, queued): True.

        Skipped while the key's known expiry is within a small lag of entry's (a tenth of
        the TTL, at most a minute), so a hot block costs Redis one PEXPIRE per lag, not one per hit.
        """
        with self._lock:
            known = self._known.get(entry.block_hash)
            if known is None:
                return False
            if entry.expires_at <= known + min(_REFRESH_LAG_S, entry.ttl_s / 10):
                return True
            self._known[entry.block_hash] = entry.expires_at
        if self.events is not None:
            self.events.stored(self.medium, entry.block_hash, entry.parent_hash, entry.ttl_s, entry.expires_at)
        px = int((entry.expires_at - self.clock.now()) * 1000)
        if px > 0 and not self.breaker.is_open:
            self.writer.submit(RefreshJob(entry.detached(), px))
        return True

    def store(self, entry: TierEntry, source: torch.Tensor, *, now: float, demote: Demote | None) -> bool:
        """Copy the block into a new buffer and queue it for the writer; False if Redis is down or behind."""
        px = int((entry.expires_at - now) * 1000)
        if px <= 0:
            return False
        if self.breaker.is_open:
            with self._lock:
                self.stats.skipped += 1
                self.stats.dropped_stores += 1
            return False
        with self._lock:
            buffer = self._free_buffers.pop() if self._free_buffers else None
            if buffer is None:  # the writer is that far behind: this block is not shared
                self.stats.dropped_stores += 1
                return False
        dest = self.layout.typed(self._staging[buffer, self.payload_offset :])
        fence = None
        if source.device.type == "cpu":
            np.copyto(_bits(dest), _bits(source))  # torch's copy_ wakes its thread pool for one block
        else:
            fence = copy_block(dest, source)
        if not self.writer.submit(StoreJob(entry.detached(), buffer, fence, px)):
            wait(fence)
            self._release(buffer)
            with self._lock:
                self.stats.dropped_stores += 1
            return False
        return True

    def _release(self, buffer: int) -> None:
        with self._lock:
            self._free_buffers.append(buffer)

    def _write(self, jobs: Sequence[WriteJob]) -> None:
        """The writer thread: one pipeline for a batch of stores and refreshes."""
        wall = time.time()

        def send() -> list[object]:
            pipe = self.client.pipeline(transaction=False)
            for job in jobs:
                key = self.key(job.entry.block_hash)
                if isinstance(job, StoreJob):
                    pipe.set(key, self._value(job, wall), nx=True, px=job.px_ms)
                pipe.pexpire(key, job.px_ms, gt=True)
            return pipe.execute()

        try:
            replies = self._call(send)
        finally:
            for job in jobs:
                if isinstance(job, StoreJob):
                    self._release(job.buffer)
        stores = sum(isinstance(job, StoreJob) for job in jobs)
        if replies is None:
            with self._lock:
                self.stats.dropped_stores += stores
            return
        now = self.clock.now()
        it = iter(replies)
        for job in jobs:
            stored = next(it) if isinstance(job, StoreJob) else False
            extended = next(it)
            if stored:
                with self._lock:
                    self.stats.stores += 1
                    self.stats.bytes_written += self.layout.nbytes
            if isinstance(job, StoreJob) or extended:
                # Stored now, or by another engine first (NX), or still there (refresh).
                entry = job.entry
                self._remember(entry.block_hash, now + job.px_ms / 1000, ttl_s=entry.ttl_s, parent=entry.parent_hash)
            else:
                self._forget(job.entry.block_hash, evicted=True)

    def _value(self, job: StoreJob, wall: float) -> memoryview:
        """The job's buffer sealed: its payload (already there) encrypted in place, its header filled in."""
        wait(job.fence)
        raw = self._staging[job.buffer].numpy()
        payload = raw[self.payload_offset :]
        entry = job.entry
        seal = seal_payload(self.keys, entry.block_hash, payload)  # on the writer thread, off the engine's
        header = (
            RecordHeader(
                layout=self._layout_key,
                block_hash=entry.block_hash,
                ttl_s=entry.ttl_s,
                last_used=wall,
                expires_at=wall + job.px_ms / 1000,  # informational: Redis's own expiry rules
                payload_len=self.layout.nbytes,
                token_ids=entry.token_ids,
            )
            .sealed(*seal)
            .pack(self.keys)
        )
        raw[: len(header)] = np.frombuffer(header, dtype=np.uint8)
        raw[len(header) : self.payload_offset] = 0
        return memoryview(raw)

    def write_out_blocks(self, now: float) -> Iterator[tuple[TierEntry, torch.Tensor]]:
        """Nothing: what is here outlives the engine."""
        return iter(())

    # -- lifecycle ----------------------------------------------------------------------

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        """Send what is queued (within the timeouts), then release the threads and connections."""
        if self._closed:
            return
        self._closed = True
        self.writer.close()
        self._reader.shutdown(wait=True)
        self.client.close()

    # -- internals ----------------------------------------------------------------------

    def _call(self, send: Callable[[], T]) -> T | None:
        """send()'s result, or None when Redis failed or the breaker is open (counted, logged once per outage)."""
        if not self.breaker.allow():
            with self._lock:
                self.stats.skipped += 1
            return None
        try:
            result = send()
        except Exception as exc:  # refused, timed out, or anything else: Redis only ever costs a miss
            opened = not self.breaker.is_open
            self.breaker.failure()
            with self._lock:
                self.stats.errors += 1
            if opened:
                log.warning("kv_redis_unavailable", error=str(exc), retry_in_s=self.breaker.backoff_s)
            return None
        self.breaker.success()
        return result

    def _delete(self, block_hash: BlockHash, key: str) -> None:
        """Drop a value that does not open (synchronously, so the next lookup cannot find it again).

        Left there, it would also keep the block out for good: stores are SET NX.
        """
        self._forget(block_hash, evicted=True)
        with self._lock:
            self._found_under.pop(block_hash, None)
        self._call(lambda: self.client.delete(key))

    def _remember(
        self, block_hash: BlockHash, expires_at: float, *, ttl_s: int, parent: BlockHash | None = None
    ) -> None:
        with self._lock:
            known = self._known.pop(block_hash, None)
            self._known[block_hash] = expires_at if known is None else max(known, expires_at)
            # Past capacity the oldest is only no longer indexed here (it may well still be in Redis):
            # no removal is reported; the event log's sweep reports it when its known expiry passes.
            while len(self._known) > self._capacity:
                self._known.popitem(last=False)
            events = self.events
        if events is not None and (known is None or expires_at > known):
            events.stored(self.medium, block_hash, parent, ttl_s, expires_at)

    def _forget(self, block_hash: BlockHash, *, evicted: bool) -> None:
        with self._lock:
            known = self._known.pop(block_hash, None) is not None
            if known and evicted:
                self.stats.evictions += 1
            events = self.events
        if known and events is not None:
            events.removed(self.medium, block_hash)


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's memory as a numpy array of its shape and strides (bits, any dtype: bf16 included)."""
    return t.view(_INT_OF_SIZE[t.element_size()]).numpy()


def connect(url: str, timeout_s: float) -> redis.Redis:
    """A client that fails fast: short connect and read timeouts, no retries (the breaker backs off)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )
