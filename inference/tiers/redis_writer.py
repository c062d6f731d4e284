"""The Redis tier's writer thread: stores and expiry refreshes, sent in pipelines off the engine thread.

The queue is bounded and never waited on: when Redis is slower than the engine evicts
and commits, submit() says no and the block is simply not shared (counted as a dropped
store). The engine thread must never stall on a network store.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from inference.tiers.lru_index import TierEntry
from inference.tiers.transfer import Fence

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class StoreJob:
    entry: TierEntry  # the block's metadata (detached)
    buffer: int  # the tier's staging buffer holding the value: header room, then a copy of the block
    fence: Fence | None  # the copy into value, when it may still be running (CUDA)
    px_ms: int  # its remaining lifetime


@dataclass(frozen=True, slots=True)
class RefreshJob:
    entry: TierEntry
    px_ms: int


WriteJob = StoreJob | RefreshJob


class RedisWriter:
    """Drains jobs in batches of up to batch_size; send(batch) makes one round trip of them."""

    def __init__(self, send: Callable[[Sequence[WriteJob]], None], *, max_queued: int, batch_size: int) -> None:
        self._send = send
        self.batch_size = batch_size
        self._jobs: queue.Queue[WriteJob | None] = queue.Queue(maxsize=max_queued)
        self._thread = threading.Thread(target=self._run, name="kvgate-redis-write", daemon=True)
        self._thread.start()

    def submit(self, job: WriteJob) -> bool:
        """Queue job; False, without waiting, when the queue is full or the writer closed."""
        if not self._thread.is_alive():
            return False
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            return False
        return True

    @property
    def num_pending(self) -> int:
        return self._jobs.unfinished_tasks

    def flush(self) -> None:
        self._jobs.join()

    def close(self) -> None:
        """Send what is queued, then stop."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            batch = [self._jobs.get()]
            while len(batch) < self.batch_size and batch[-1] is not None:
                try:
                    batch.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            jobs = [job for job in batch if job is not None]
            try:
                if jobs:
                    self._send(jobs)
            except Exception:  # a failed batch loses cached blocks, never the writer
                log.exception("kv_redis_write_failed")
            finally:
                for _ in batch:
                    self._jobs.task_done()
            if batch[-1] is None:
                return
