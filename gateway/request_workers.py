"""Worker processes that turn large request bodies into engine input: parse, validate, render, tokenize.

The event loop serves every tenant, so nothing that takes more than a few
milliseconds may run on it, and a thread does not help: json, pydantic and Jinja
hold the GIL while they work, so the loop waits for them all the same. (Measured:
a 5 MB body of 185,000 one-character text blocks held the GIL for about 4 s in
json.loads and pydantic's validation, each one uninterruptible call.) A large body
is therefore handed to a worker process as bytes, and only the small result comes
back: the prompt's token ids and sampling parameters, or an error.

Concurrency is bounded twice: `processes` workers in all, and one job per tenant
at a time, so a tenant sending a stream of huge requests waits behind itself,
not in front of everyone else. Workers run at a lower CPU priority (WORKER_NICE)
than the event loop and the engine.

Workers come from a fork server that has already imported transformers, so a
worker starts in well under a second; the fork server itself starts on first use,
or in the background at start-up (prewarm).

Neither outlives the gateway, even one killed with SIGKILL: each worker watches the
gateway's pid (a pidfd) and exits when it ends, and the fork server exits once the
gateway and its workers, the holders of its lifeline pipe, are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import multiprocessing.forkserver as forkserver
import os
import pickle
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import structlog

from gateway.prompt import PromptRenderer
from gateway.prompt_bounds import PromptBounds
from gateway.services.completions import PrepareContext
from kvgate.errors import ApiError, InvalidRequestError

log = structlog.get_logger("kvgate.gateway")

R = TypeVar("R")
WORKER_NICE = 5
# How long close() waits for each terminated worker.
WORKER_JOIN_S = 5.0
MAX_DEFAULT_PROCESSES = 4
PRELOAD = ["transformers", "gateway.services.completions", "gateway.request_workers"]
# Where pidfds are missing (not Linux, or a kernel before 5.3), how often a worker checks its gateway.
GATEWAY_POLL_S = 1.0


def default_processes() -> int:
    """Half the cores this process may use (the rest is the engine's and the loop's), 1 to 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_PROCESSES, cores // 2))


@dataclass(frozen=True)
class WorkerSetup:
    """Everything a worker needs to build its own PrepareContext (the tokenizer travels pickled)."""

    tokenizer: Any
    model_id: str
    max_model_len: int
    min_cacheable_tokens: int
    bounds: PromptBounds


class RequestWorkers:
    def __init__(self, *, processes: int | None, setup: WorkerSetup) -> None:
        self.processes = processes or default_processes()
        self._setup = pickle.dumps(setup)
        self._executor: ProcessPoolExecutor | None = None
        self._tenant_locks: dict[str, asyncio.Lock] = {}
        self._tenant_jobs: dict[str, int] = {}

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            self._executor = ProcessPoolExecutor(
                max_workers=self.processes,
                mp_context=context,
                initializer=_start_worker,
                # A worker's parent is the fork server, not the gateway: it is told which process to end with.
                initargs=(self._setup, os.getpid()),
            )
        return self._executor

    def prewarm(self) -> None:
        """Start the fork server and a worker now, in the background, rather than on the first large body."""
        threading.Thread(target=self._prewarm, args=(self._pool(),), name="kvgate-prewarm", daemon=True).start()

    @staticmethod
    def _prewarm(pool: ProcessPoolExecutor) -> None:
        # Best effort: a server stopped while the fork server still starts shuts the pool down under
        # this thread, and its traceback would land, raw, in the JSON log stream.
        try:
            pool.submit(_ready)
        except Exception as exc:
            log.info("request_workers_prewarm_skipped", reason=str(exc) or type(exc).__name__)

    async def run(self, tenant_id: str, job: Callable[[PrepareContext, bytes, str | None], R], *args: Any) -> R:
        """`job(context, *args)` in a worker, after this tenant's earlier jobs; its KvgateErrors propagate."""
        lock = self._tenant_locks.setdefault(tenant_id, asyncio.Lock())
        self._tenant_jobs[tenant_id] = self._tenant_jobs.get(tenant_id, 0) + 1
        try:
            async with lock:
                pool = self._pool()
                try:
                    # submit() may start a worker process, and waits while the fork server is still
                    # importing: a thread's wait, not the event loop's.
                    try:
                        future = await asyncio.to_thread(pool.submit, _run_job, job, *args)
                    except BrokenProcessPool:
                        # Broken before this job was taken (a worker died on an earlier one): this
                        # job never ran, so it starts again on a fresh pool.
                        self._discard(pool)
                        pool = self._pool()
                        future = await asyncio.to_thread(pool.submit, _run_job, job, *args)
                    return await asyncio.wrap_future(future)
                except BrokenProcessPool as exc:
                    # A worker died on this job (killed for memory, say): the next job gets a fresh pool.
                    self._discard(pool)
                    log.error("request_worker_died")
                    raise ApiError("a request worker failed while preparing this request") from exc
        finally:
            self._tenant_jobs[tenant_id] -= 1
            if not self._tenant_jobs[tenant_id]:
                del self._tenant_jobs[tenant_id], self._tenant_locks[tenant_id]

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        if self._executor is pool:
            self._executor = None
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the workers and the fork server at once, so none outlives the server holding its stdio.

        Called once requests have drained: a job still running here was abandoned by shutdown anyway,
        and a worker holds nothing but a request being parsed, so it is killed rather than asked.
        """
        executor, self._executor = self._executor, None
        if executor is None:
            return
        # shutdown() drops the executor's reference to its workers, not the dict itself.
        workers = executor._processes
        # The fork server first: a worker start still waiting for its preload (the prewarm, on a
        # loaded machine) then fails at once instead of holding the executor's lock, and so
        # shutdown(), until the import is done. Again after: a start that got in first has made one.
        _stop_fork_server()
        executor.shutdown(wait=False, cancel_futures=True)
        _stop_fork_server()
        processes = list((workers or {}).values())
        for process in processes:
            process.kill()
        for process in processes:
            process.join(timeout=WORKER_JOIN_S)


def _stop_fork_server() -> None:
    # The fork server would exit on its own once this process is gone; until then it holds the
    # server's stderr, so whoever reads that to its end (a supervisor, a test) waits for it. It is
    # killed, not asked: while it still imports its preload it does not notice its lifeline closing.
    server = forkserver._forkserver
    pid = server._forkserver_pid
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        server._stop()  # reaps it and resets the singleton: the next use starts a new one


# -- in the worker process ------------------------------------------------------------------------

_CONTEXT: PrepareContext | None = None


def _start_worker(setup_bytes: bytes, gateway_pid: int) -> None:
    global _CONTEXT
    _exit_with(gateway_pid)
    with contextlib.suppress(OSError):  # not allowed here: run at the parent's priority
        os.nice(WORKER_NICE)
    setup: WorkerSetup = pickle.loads(setup_bytes)
    tokenizer = setup.tokenizer
    renderer = PromptRenderer(
        # What the engine's apply_chat_template does (inference.async_engine), with this copy of its tokenizer.
        apply_chat_template=partial(tokenizer.apply_chat_template, tokenize=False, add_generation_prompt=True),
        tokenizer=tokenizer,
        bounds=setup.bounds,
        max_prompt_tokens=setup.max_model_len - 1,
    )
    _CONTEXT = PrepareContext(setup.model_id, setup.max_model_len, setup.min_cacheable_tokens, renderer)


def _exit_with(gateway_pid: int) -> None:
    """End this worker when the gateway process ends, however it ends.

    A worker blocks on its call queue, whose write end it holds itself (the queue travels pickled
    whole), so a gateway killed with SIGKILL never shows it an EOF: without this it, and through
    the lifeline pipe it holds the fork server, live on (hundreds of MB each) until someone kills
    them. PR_SET_PDEATHSIG does not fit: it fires when the parent *thread* ends, and a worker's
    parent is the fork server, whose own parent thread is whichever gateway thread first needed it
    (the prewarm thread, which ends at once).
    """
    try:
        pidfd = os.pidfd_open(gateway_pid)
    except ProcessLookupError:
        os._exit(0)  # gone before this worker started
    except (AttributeError, OSError):
        pidfd = None  # no pidfds here: poll instead
    threading.Thread(target=_watch_gateway, args=(gateway_pid, pidfd), name="kvgate-gateway-watch", daemon=True).start()


def _watch_gateway(gateway_pid: int, pidfd: int | None) -> None:
    if pidfd is not None:
        # Readable once the process has exited, zombie or reaped; a reused pid cannot fool it.
        select.select([pidfd], [], [])
    else:
        # kill(0) also answers for a zombie: here the worker ends once the gateway is reaped.
        while _alive(gateway_pid):
            time.sleep(GATEWAY_POLL_S)
    # os._exit, not sys.exit: from this thread, with the main thread blocked in the queue's read.
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ready() -> bool:
    return _CONTEXT is not None


def _run_job(job: Callable[..., R], *args: Any) -> R:
    from fastapi.exceptions import RequestValidationError

    from gateway.api.errors import validation_message

    assert _CONTEXT is not None
    try:
        return job(_CONTEXT, *args)
    except RequestValidationError as exc:
        # Worded here as the exception handler would: FastAPI's error does not pickle with its details.
        message, param = validation_message(list(exc.errors()))
        raise InvalidRequestError(message, param=param) from None
