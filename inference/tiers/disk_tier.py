"""The disk tier: fixed-size block records in segment files, indexed in memory, rebuilt at start-up.

Files live in <dir>/kv-<layout fingerprint>/seg-NNNNNN.kvs, each holding up to
slots_per_segment records (see disk_format). Slot s is record s % slots_per_segment
of segment s // slots_per_segment; a slot is reused in place when its entry is
evicted. One engine owns a directory at a time (an flock on its LOCK file).

store() copies a block into a staging buffer and queues it; the offload worker
writes it (write()). The engine thread looks up, locks and reads. A mutex
guards the index; file I/O runs outside it. Entries being loaded are locked, so the
worker never overwrites their slots mid-read. Records are written with O_DIRECT
where the filesystem supports it: on a CPU-bound host a buffered write costs twice
the CPU (a copy into the page cache, then writeback), taken from the model's
threads. Reads stay buffered, so a block read twice comes from the page cache.

Records are sealed (disk_format, sealing): encrypted and authenticated under a key
derived from the tier key (KVGATE_KV_TIER_KEY) and the block's salted hash. A record
that does not open (damaged, forged, or under a key no longer configured) is a miss:
counted in checksum_failures, logged at a bounded rate, and its header cleared.

KV events (attach_events): stores, refreshes and removals are reported under the
mutex, from whichever thread makes them, so their order is the index's order.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import structlog
import torch

from inference.clock import Clock
from inference.hashing import BlockHash
from inference.tiers.base import Demote
from inference.tiers.disk_format import (
    RecordHeader,
    header_size,
    open_payload,
    payload_offset,
    record_size,
    seal_payload,
)
from inference.tiers.layout import BlockLayout
from inference.tiers.lru_index import LruIndex, TierEntry
from inference.tiers.offload_worker import OffloadWorker, WriteJob
from inference.tiers.sealing import RejectLog, TierKeys
from inference.tiers.staging import StagingPool
from inference.tiers.stats import TierStats
from inference.tiers.transfer import copy_block, wait

if TYPE_CHECKING:
    from inference.kv_event_log import BlockEvents
    from inference.settings import EngineSettings

log = structlog.get_logger(__name__)

DEFAULT_SEGMENT_BYTES = 256 * 2**20


class DiskTierLockedError(RuntimeError):
    """Another engine already uses this disk tier directory."""


def _pwrite_all(fd: int, data: memoryview | bytes, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class DiskTier:
    """Blocks in files, kept across restarts; store() is asynchronous (see the module doc).

    With staging_blocks=0 it has no staging buffers and no writer thread: blocks go in
    through write() only (tests and tools that write records themselves).
    """

    name = "disk"
    shared = False  # one engine owns the directory (its flock)
    persistent = True

    def __init__(
        self,
        root: Path,
        layout: BlockLayout,
        capacity: int,
        *,
        clock: Clock,
        pin_min_ttl_s: int,
        pin_share: float,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        staging_blocks: int = 0,
        pin_memory: bool = False,
        keys: TierKeys | None = None,
    ) -> None:
        assert capacity > 0
        self.layout = layout
        # None: this process's random key (tests and tools; the engine passes TierKeys.from_settings).
        self.keys = keys if keys is not None else TierKeys.process_keys()
        self.clock = clock
        self.dir = Path(root) / f"kv-{layout.fingerprint}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock = self._lock_dir()
        bs = layout.block_size
        self._header_size = header_size(bs)
        self.payload_offset = payload_offset(bs)
        self.record_size = record_size(bs, layout.nbytes)
        self.slots_per_segment = max(1, segment_bytes // self.record_size)
        self.index = LruIndex(capacity, pin_min_ttl_s=pin_min_ttl_s, pin_share=pin_share)
        self.stats = TierStats()
        self.num_purged_at_start = 0
        self.rebuild_s = 0.0  # how long start-up took to index the directory
        self._layout_key = int(layout.fingerprint, 16)
        self._mutex = threading.Lock()
        self._fds: dict[int, int] = {}  # buffered: reads, the start-up scan, header clears
        self._direct_fds: dict[int, int] = {}  # O_DIRECT (or buffered, where unsupported): record writes
        self._free_slots: list[int] = []
        # Each indexed slot's payload seal (the header it was written with): read() opens the
        # payload with it, and a refreshed header is re-sealed around it.
        self._headers: dict[int, RecordHeader] = {}
        self._rejects = RejectLog("kv_disk_record_rejected")
        self._closed = False
        self.events: BlockEvents | None = None
        self.medium = "DISK"
        self._rebuild(clock.now())
        # A load reads into this buffer, verifies it, then copies it to the device.
        self._read_buffer = torch.empty(layout.nbytes, dtype=torch.uint8, pin_memory=pin_memory)
        self.staging: StagingPool | None = None
        self.worker: OffloadWorker | None = None
        if staging_blocks > 0:
            self.staging = StagingPool(
                layout,
                staging_blocks,
                record_size=self.record_size,
                payload_offset=self.payload_offset,
                pin_memory=pin_memory,
            )
            self.worker = OffloadWorker(self, self.staging)

    @classmethod
    def from_settings(
        cls,
        settings: EngineSettings,
        layout: BlockLayout,
        *,
        clock: Clock,
        pin_memory: bool,
        model_fingerprint: str = "",
    ) -> DiskTier | None:
        """KVGATE_KV_DISK_DIR, KVGATE_KV_DISK_GIB (or _BLOCKS); None without a directory."""
        blocks = settings.kv_disk_blocks
        if blocks is None:  # a record is the block plus its header page: the limit counts both
            blocks = int(settings.kv_disk_gib * 2**30) // record_size(layout.block_size, layout.nbytes)
        if settings.kv_disk_dir is None or blocks <= 0:
            return None
        return cls(
            settings.kv_disk_dir,
            layout,
            blocks,
            clock=clock,
            pin_min_ttl_s=settings.kv_pin_min_ttl_s,
            pin_share=settings.kv_pin_share,
            staging_blocks=max(1, int(settings.kv_offload_staging_mib * 2**20) // layout.nbytes),
            pin_memory=pin_memory,
            keys=TierKeys.from_settings(settings),
        )

    @property
    def capacity(self) -> int:
        return self.index.capacity

    def __len__(self) -> int:
        return len(self.index)

    @property
    def num_pending_stores(self) -> int:
        return 0 if self.worker is None else self.worker.num_pending

    # -- KV events --------------------------------------------------------------------------

    def attach_events(self, events: BlockEvents, medium: str) -> None:
        """Report this tier's blocks to events from now on, starting with those it holds (found at start-up)."""
        with self._mutex:
            self.events, self.medium = events, medium
            for entry in self.index.lru_order():
                self._report_stored(entry)

    def expiry(self, block_hash: BlockHash, now: float) -> float | None:
        """The block's expiry here, or None when it is not here."""
        with self._mutex:
            entry = self.index.get(block_hash)
            return None if entry is None else entry.expires_at

    def _report_stored(self, entry: TierEntry) -> None:
        if self.events is not None:
            self.events.stored(self.medium, entry.block_hash, entry.parent_hash, entry.ttl_s, entry.expires_at)

    def _report_removed(self, entry: TierEntry) -> None:
        if self.events is not None:
            self.events.removed(self.medium, entry.block_hash)

    # -- engine thread: the KVTier interface -----------------------------------------------

    def store(self, entry: TierEntry, source: torch.Tensor, *, now: float, demote: Demote | None) -> bool:
        """Snapshot the block into a staging buffer (waiting for one if all are in flight) and queue it.

        The worker finds room when it writes; its victims are dropped (nothing is below the disk).
        """
        assert self.staging is not None and self.worker is not None, "a DiskTier without staging takes write() only"
        buffer = self.staging.acquire()
        fence = copy_block(self.staging.block(buffer), source)
        self.worker.submit(WriteJob(entry, buffer, fence))
        return True

    def prepare_load(self, entries: Sequence[TierEntry]) -> bool:
        """Lock entries for a load and start reading them all (see prefetch)."""
        if not self.lock(entries):
            return False
        # In file order: a prefix evicted tail-first sits in descending slots, and reading
        # it backwards would defeat the kernel's readahead.
        self.prefetch(sorted(entries, key=lambda e: e.slot))
        return True

    def load(self, entry: TierEntry, dest: torch.Tensor) -> bool:
        if not self.read(entry, self._read_buffer.numpy()):
            return False
        # The read buffer is reused for the next block, so this copy must be done first.
        wait(copy_block(dest, self.layout.typed(self._read_buffer)))
        return True

    def complete_load(self, entries: Sequence[TierEntry], *, failed: Sequence[TierEntry] = ()) -> None:
        self.unlock(entries, bad=failed)

    def touch(self, entries: Sequence[TierEntry]) -> None:
        """Nothing to do: read() marked each entry most recently used as it was read."""

    def write_out_blocks(self, now: float) -> Iterator[tuple[TierEntry, torch.Tensor]]:
        """Nothing: what is here survives a restart."""
        return iter(())

    def flush(self) -> None:
        if self.worker is not None:
            self.worker.flush()

    # -- engine thread ----------------------------------------------------------------

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int], now: float) -> TierEntry | None:
        """The live entry holding exactly token_ids under block_hash; an expired one is dropped."""
        with self._mutex:
            return self.index.lookup(block_hash, token_ids, now, self._evict)

    def __contains__(self, block_hash: BlockHash) -> bool:
        with self._mutex:
            return block_hash in self.index

    def refresh(self, entry: TierEntry) -> bool:
        """If the block is stored already, refresh its entry from entry (TTL, expiry, recency): True."""
        with self._mutex:
            existing = self.index.get(entry.block_hash)
            if existing is None:
                return False
            self.index.refresh(existing, entry)
            self._report_stored(existing)
            return True

    def lock(self, entries: Sequence[TierEntry]) -> bool:
        """Lock entries against eviction for a load; False, locking none, if one is gone already."""
        with self._mutex:
            if any(self.index.get(e.block_hash) is not e for e in entries):
                return False
            for entry in entries:
                entry.locks += 1
            return True

    def unlock(self, entries: Sequence[TierEntry], *, bad: Sequence[TierEntry] = ()) -> None:
        """Undo lock(); entries in bad failed verification and are dropped (their headers cleared)."""
        with self._mutex:
            for entry in entries:
                assert entry.locks > 0
                entry.locks -= 1
            for entry in bad:
                if entry.locks == 0 and self.index.get(entry.block_hash) is entry:
                    self._evict(entry)
        for entry in bad:
            self._clear_header(entry.slot)

    def prefetch(self, entries: Sequence[TierEntry]) -> None:
        """Start reading these locked entries' payloads, all at once, before read() asks for each.

        One synchronous read after another waits on the disk each time; queued together
        the reads overlap (4-5x the bandwidth of this machine's virtual disk).
        """
        for entry in entries:
            assert entry.locks > 0
            fd, offset = self._locate(entry.slot)
            with contextlib.suppress(OSError, AttributeError):
                os.posix_fadvise(fd, offset + self.payload_offset, self.layout.nbytes, os.POSIX_FADV_WILLNEED)

    def read(self, entry: TierEntry, out: np.ndarray) -> bool:
        """Read a locked entry's payload into out (uint8, nbytes) and decrypt it; False if short or it fails to open.

        On False out holds garbage: the caller must not use it.
        """
        assert entry.locks > 0 and out.nbytes == self.layout.nbytes
        fd, offset = self._locate(entry.slot)
        with self._mutex:
            header = self._headers.get(entry.slot)
        try:
            n = os.preadv(fd, [out], offset + self.payload_offset)
        except OSError as exc:
            log.warning("kv_disk_read_failed", error=str(exc))
            n = -1
        ok = (
            n == out.nbytes
            and header is not None
            and header.block_hash == entry.block_hash
            and open_payload(self.keys, header, out)
        )
        if not ok:
            self._rejects(tier=self.name, reason="payload", slot=entry.slot)
        with self._mutex:
            if ok:
                self.stats.loads += 1
                self.stats.bytes_read += out.nbytes
                self.index.touch(entry)
            else:
                self.stats.checksum_failures += 1
        return ok

    # -- offload worker -----------------------------------------------------------------

    def write(self, entry: TierEntry, record: np.ndarray) -> None:
        """Store a block (entry carries its metadata); a block already stored is only refreshed.

        record is a page-aligned staging buffer laid out as a whole record, its payload
        filled in; its header is written here.
        """
        assert record.nbytes == self.record_size
        payload = record[self.payload_offset : self.payload_offset + self.layout.nbytes]
        with self._mutex:
            existing = self.index.get(entry.block_hash)
            if existing is not None:  # stored while this job waited
                self.index.refresh(existing, entry)
                self._report_stored(existing)
                return
            slot = self._take_slot(self.clock.now())
            if slot is None:
                self.stats.dropped_stores += 1
                return
        # Sealed here, on the worker thread: encryption costs the engine thread nothing.
        sealed = self._plain_header(entry).sealed(*seal_payload(self.keys, entry.block_hash, payload))
        entry.dirty = False  # the header written now is current
        try:
            self._write_record(slot, sealed, record)
        except OSError as exc:
            log.warning("kv_disk_write_failed", error=str(exc))
            with self._mutex:
                self._free_slots.append(slot)
                self.stats.dropped_stores += 1
            return
        with self._mutex:
            entry.slot = slot
            self._headers[slot] = sealed
            self.index.add(entry)
            self._report_stored(entry)
            self.stats.stores += 1
            self.stats.bytes_written += payload.nbytes

    def write_refreshed_headers(self) -> int:
        """Rewrite the header of every entry refreshed since it was written; returns how many.

        A hit or a re-store extends an entry's expiry in memory only. Rewritten, the
        longer expiry survives a restart, so a block read within its TTL is not purged
        at start-up as if it had not been used since it was written. A header page torn
        by a crash fails its tag: that block is lost, never loaded wrong.
        """
        with self._mutex:
            dirty = [e for e in self.index if e.dirty and e.locks == 0 and e.slot in self._headers]
            headers = [(e.slot, self._refreshed(e)) for e in dirty]
            for entry in dirty:
                entry.dirty = False
        for slot, header in headers:
            fd, offset = self._locate(slot)
            try:
                _pwrite_all(fd, header, offset)
            except OSError as exc:
                log.warning("kv_disk_write_failed", error=str(exc))
        return len(headers)

    def close(self) -> None:
        """Write what is queued and the refreshed headers, then release the files and the directory's lock."""
        if self._closed:
            return
        self._closed = True
        if self.worker is not None:
            self.worker.close()
        self.write_refreshed_headers()
        for fd in {*self._fds.values(), *self._direct_fds.values()}:
            os.close(fd)
        self._fds.clear()
        self._direct_fds.clear()
        if self._dir_lock is not None:
            os.close(self._dir_lock)  # releases the flock
            self._dir_lock = None

    # -- internals ----------------------------------------------------------------------

    def _take_slot(self, now: float) -> int | None:
        if self._free_slots:
            return self._free_slots.pop()
        victim = self.index.pick_victim(now)
        if victim is None:
            return None
        self.index.remove(victim)
        self._headers.pop(victim.slot, None)
        self._report_removed(victim)
        self.stats.evictions += 1
        return victim.slot

    def _drop(self, entry: TierEntry) -> None:
        self._headers.pop(entry.slot, None)
        self.index.remove(entry)
        self._report_removed(entry)
        self._free_slots.append(entry.slot)

    def _evict(self, entry: TierEntry) -> None:
        """Take out an entry that expired or failed verification; it counts as an eviction."""
        self._drop(entry)
        self.stats.evictions += 1

    def _plain_header(self, entry: TierEntry) -> RecordHeader:
        return RecordHeader(
            layout=self._layout_key,
            block_hash=entry.block_hash,
            ttl_s=entry.ttl_s,
            last_used=entry.last_used,
            expires_at=entry.expires_at,
            payload_len=self.layout.nbytes,
            token_ids=entry.token_ids,
        )

    def _refreshed(self, entry: TierEntry) -> bytes:
        """The entry's header with its current TTL, expiry and last use, around its payload's seal (under the mutex)."""
        old = self._headers[entry.slot]
        new = self._plain_header(entry).sealed(old.key_id, old.payload_nonce, old.payload_tag)
        self._headers[entry.slot] = new
        return new.pack(self.keys)

    def _write_record(self, slot: int, sealed: RecordHeader, record: np.ndarray) -> None:
        header = sealed.pack(self.keys)
        record[: len(header)] = np.frombuffer(header, dtype=np.uint8)
        segment, index = divmod(slot, self.slots_per_segment)
        try:
            _pwrite_all(self._direct_fd(segment), record, index * self.record_size)
        except OSError as exc:
            if exc.errno != errno.EINVAL or self._direct_fds[segment] == self._fds.get(segment):
                raise
            # Opened with O_DIRECT but refused it: write through the page cache from now on.
            os.close(self._direct_fds[segment])
            self._direct_fds[segment] = self._locate(slot)[0]
            _pwrite_all(self._direct_fds[segment], record, index * self.record_size)

    def _clear_header(self, slot: int) -> None:
        fd, offset = self._locate(slot)
        try:
            _pwrite_all(fd, bytes(self._header_size), offset)
        except OSError as exc:
            log.warning("kv_disk_write_failed", error=str(exc))

    def _locate(self, slot: int) -> tuple[int, int]:
        segment, index = divmod(slot, self.slots_per_segment)
        fd = self._fds.get(segment)
        if fd is None:
            fd = self._fds[segment] = os.open(self._segment_path(segment), os.O_RDWR | os.O_CREAT, 0o600)
        return fd, index * self.record_size

    def _direct_fd(self, segment: int) -> int:
        fd = self._direct_fds.get(segment)
        if fd is None:
            path = self._segment_path(segment)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
            except OSError:  # e.g. tmpfs: no O_DIRECT there
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            self._direct_fds[segment] = fd
        return fd

    def _segment_path(self, segment: int) -> Path:
        return self.dir / f"seg-{segment:06d}.kvs"

    def _lock_dir(self) -> int:
        fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DiskTierLockedError(f"another engine is using the KV disk tier in {self.dir}") from None
        return fd

    def _rebuild(self, now: float) -> None:
        """Index every valid, unexpired record; purge expired ones; drop segments past the capacity."""
        started = time.perf_counter()
        found: list[tuple[RecordHeader, int]] = []
        for path in sorted(self.dir.glob("seg-*.kvs")):
            segment = int(path.stem.removeprefix("seg-"))
            first = segment * self.slots_per_segment
            if first >= self.capacity:
                path.unlink()
                continue
            fd, _ = self._locate(first)
            num_slots = min(self.slots_per_segment, self.capacity - first)
            if os.fstat(fd).st_size > num_slots * self.record_size:
                os.ftruncate(fd, num_slots * self.record_size)  # the capacity shrank
            # Queued together, the header reads overlap: one at a time, each waits on the disk.
            with contextlib.suppress(OSError, AttributeError):
                for slot in range(first, first + num_slots):
                    os.posix_fadvise(fd, self._locate(slot)[1], self._header_size, os.POSIX_FADV_WILLNEED)
            for slot in range(first, first + num_slots):
                header = self._read_header(slot)
                if header is None:
                    continue
                if header.expires_at <= now:
                    self._clear_header(slot)
                    self.num_purged_at_start += 1
                    continue
                found.append((header, slot))
        used: set[int] = set()
        for header, slot in sorted(found, key=lambda f: f[0].last_used):
            old = self.index.get(header.block_hash)
            if old is not None:  # the same block twice (a crash between writes): keep the newer
                self.index.remove(old)
                used.discard(old.slot)
                del self._headers[old.slot]
            entry = TierEntry(
                block_hash=header.block_hash,
                token_ids=header.token_ids,
                ttl_s=header.ttl_s,
                expires_at=header.expires_at,
                last_used=header.last_used,
                slot=slot,
            )
            self.index.add(entry)
            self._headers[slot] = header
            used.add(slot)
        self._free_slots = [s for s in range(self.capacity - 1, -1, -1) if s not in used]
        self.rebuild_s = time.perf_counter() - started
        log.info(
            "kv_disk_tier_ready",
            dir=str(self.dir),
            blocks=len(self.index),
            purged=self.num_purged_at_start,
            seconds=round(self.rebuild_s, 3),
        )

    def _read_header(self, slot: int) -> RecordHeader | None:
        fd, offset = self._locate(slot)
        data = os.pread(fd, self._header_size, offset)
        header = RecordHeader.unpack(data, block_size=self.layout.block_size, keys=self.keys)
        if header is None or header.layout != self._layout_key or header.payload_len != self.layout.nbytes:
            if any(data):  # an empty slot (never written, or cleared) is no rejection
                self._rejects(tier=self.name, reason="header", slot=slot)
            return None
        return header
