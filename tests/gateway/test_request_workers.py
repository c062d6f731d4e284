"""Request worker processes: a worker that dies fails only the job it was running."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from gateway.prompt_bounds import NO_BOUNDS
from gateway.request_workers import RequestWorkers, WorkerSetup
from kvgate.errors import ApiError

pytestmark = pytest.mark.timeout(180)


def worker_pid(context: Any) -> int:
    return os.getpid()


def die(context: Any) -> None:
    os._exit(1)


@pytest.fixture
async def workers(tiny_llama_dir: Path) -> AsyncIterator[RequestWorkers]:
    setup = WorkerSetup(AutoTokenizer.from_pretrained(tiny_llama_dir), "tiny", 4096, 1024, NO_BOUNDS)
    pool = RequestWorkers(processes=1, setup=setup)
    try:
        yield pool
    finally:
        pool.close()


async def test_a_worker_dying_on_a_job_fails_that_job_and_the_next_one_runs(workers: RequestWorkers) -> None:
    first = await workers.run("tenant", worker_pid)
    with pytest.raises(ApiError, match="request worker failed"):
        await workers.run("tenant", die)
    assert await workers.run("tenant", worker_pid) not in (first, None)


async def test_a_pool_broken_before_a_job_runs_the_job_on_a_fresh_pool(workers: RequestWorkers) -> None:
    first = await workers.run("tenant", worker_pid)
    os.kill(first, signal.SIGKILL)  # the worker dies between jobs: its pool is broken, no job was on it
    deadline = time.monotonic() + 30
    while not workers._pool()._broken:
        assert time.monotonic() < deadline, "the executor never noticed its worker died"
        await asyncio.sleep(0.05)
    # The next job never ran on the broken pool: it runs on a fresh one instead of failing.
    assert await workers.run("tenant", worker_pid) != first
