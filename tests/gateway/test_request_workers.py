"""Request worker processes: a worker that dies fails only the job it was running."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
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


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # ended while we looked
            # pid (comm) state ppid ...: comm may hold spaces, so split after its closing parenthesis.
            state, ppid = stat.rpartition(")")[2].split()[:2]
            if int(ppid) == pid and state != "Z":
                found.append(int(entry.name))
    return found


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
@pytest.mark.timeout(300)
def test_a_sigkilled_gateway_takes_its_fork_server_and_workers_with_it(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from tests.gateway.serve_process import Serve

    serve = Serve(database_url=f"sqlite:///{tmp_path / 'kvgate.db'}", model_dir=tiny_llama_dir, workdir=tmp_path)
    try:
        tenant = serve.admin.post("/admin/v1/tenants", json={"name": "t"}).json()["id"]
        key = serve.admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "k"}).json()["key"]
        # A body above the inline limit is prepared in a worker; once it is answered, the worker sits
        # idle on its call queue, where a gateway's SIGKILL used to leave it (and its fork server) for good.
        headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        model = httpx.get(f"{serve.base_url}/v1/models", headers=headers).json()["data"][0]["id"]
        body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "word " * 4000}]}
        answered = httpx.post(
            f"{serve.base_url}/v1/messages",
            json=body,
            headers=headers,
            timeout=120,
        )
        assert answered.status_code == 200, answered.text
        fork_servers = [
            pid for pid in _children(serve.process.pid) if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        workers = [worker for pid in fork_servers for worker in _children(pid)]
        assert fork_servers and workers, f"no fork server with a worker under kvgate serve:\n{serve.log()}"
        tree = _descendants(serve.process.pid)
        assert all(_running(pid) for pid in tree)
    finally:
        serve.process.kill()
        serve.process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while left := [pid for pid in tree if _running(pid)]:
        assert time.monotonic() < deadline, f"still running 10 s after kvgate serve was killed: {left}"
        time.sleep(0.1)
