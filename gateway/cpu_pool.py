"""A small thread pool for CPU-heavy request work: parsing, rendering and tokenizing large requests.

The event loop serves every tenant, so nothing that takes more than a few
milliseconds may run on it. Large requests are prepared here instead, with
bounded concurrency: at most `threads` jobs at once, and at most one per tenant,
so a tenant sending a stream of huge requests waits behind itself, not in front
of everyone else.

These jobs mostly hold the GIL (json, pydantic and Jinja do; the tokenizer
releases it), so the gateway also shortens the interpreter's switch interval
(SWITCH_INTERVAL_S): the loop thread then waits at most that long for the GIL
after each wake-up, instead of Python's default 5 ms.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

SWITCH_INTERVAL_S = 0.001


def default_threads() -> int:
    """Half the cores this process may use, at least one: the rest is the engine's and the loop's."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


class CpuPool:
    def __init__(self, threads: int | None = None) -> None:
        self.threads = threads or default_threads()
        self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="kvgate-cpu")
        self._tenant_locks: dict[str, asyncio.Lock] = {}
        self._tenant_jobs: dict[str, int] = {}
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)

    async def run(self, tenant_id: str, work: Callable[[], T]) -> T:
        """Run `work` on a pool thread, after this tenant's earlier jobs; its exceptions propagate."""
        lock = self._tenant_locks.setdefault(tenant_id, asyncio.Lock())
        self._tenant_jobs[tenant_id] = self._tenant_jobs.get(tenant_id, 0) + 1
        try:
            async with lock:
                return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        finally:
            self._tenant_jobs[tenant_id] -= 1
            if not self._tenant_jobs[tenant_id]:
                del self._tenant_jobs[tenant_id], self._tenant_locks[tenant_id]

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
