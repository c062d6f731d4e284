"""The background thread that writes staged blocks to the disk tier, off the engine's critical path."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from inference.tiers.lru_index import TierEntry
from inference.tiers.staging import StagingPool
from inference.tiers.transfer import Fence, wait

if TYPE_CHECKING:
    from inference.tiers.disk_tier import DiskTier

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class WriteJob:
    entry: TierEntry  # the block's metadata; the disk tier indexes it once written
    buffer: int  # its staging buffer
    fence: Fence | None  # the copy into the buffer, when it may still be running


class OffloadWorker:
    """Drains write jobs in order; flush() waits for all submitted ones.

    The thread keeps the default CPU priority on purpose. Niced, it was starved by
    the model's spinning OpenMP threads while holding the GIL, and the engine thread
    then waited on the GIL: evictions and decode steps ran ten times slower. Its work
    is mostly pwrite and xxh3, which hold the GIL only briefly.
    """

    def __init__(self, disk: DiskTier, staging: StagingPool) -> None:
        self.disk = disk
        self.staging = staging
        self.num_failed = 0
        self._jobs: queue.Queue[WriteJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="kvgate-offload", daemon=True)
        self._thread.start()

    def submit(self, job: WriteJob) -> None:
        assert self._thread.is_alive(), "the offload worker is closed"
        self._jobs.put(job)

    @property
    def num_pending(self) -> int:
        return self._jobs.unfinished_tasks

    def flush(self) -> None:
        self._jobs.join()

    def close(self) -> None:
        """Write what is queued, then stop."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                wait(job.fence)
                self.disk.write(job.entry, self.staging.record(job.buffer))
            except Exception:  # a failed write loses one cached block, never the worker
                self.num_failed += 1
                log.exception("kv_offload_write_failed")
            finally:
                if job is not None:
                    self.staging.release(job.buffer)
                self._jobs.task_done()
