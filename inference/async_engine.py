"""The engine's asyncio interface: what the gateway and the engine server call.

The engine core steps in one background thread (torch releases the GIL in its
kernels, so the event loop stays responsive). Requests and aborts reach it through
a locked inbox; its outputs come back to the loop with call_soon_threadsafe.

Failures: a request whose own work raises is finished with an error and the others go
on (Engine.step). If the thread itself dies, the engine is marked dead with the
reason (dead_reason), every request in flight fails at once, and submit raises
EngineUnavailableError; health checks report it. shutdown(timeout_s=...) returns in
bounded time even when the thread is stuck.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from inference.clock import Clock
from inference.engine import Engine, StepOutput
from inference.grammar import GrammarLimitError
from inference.kv_event_publisher import KVEventPublisher, attach_publisher
from inference.settings import EngineSettings
from inference.stats import EngineStats, make_engine_stats
from inference.types import (
    CacheSpec,
    EngineError,
    EngineOverloadedError,
    EngineUnavailableError,
    ErrorKind,
    FairShare,
    RequestOutput,
    SamplingParams,
    StructuredOutput,
    TokenDelta,
    Usage,
)

log = structlog.get_logger(__name__)

_DONE = object()


class RequestHandle:
    """One submitted request. Iterate it for token deltas; await result() for the final output.

    cancel() stops generation, frees the request's blocks (keeping what it committed);
    result() then returns finish_reason "cancelled" with the usage up to that point.
    prompt_usage is the prompt's cache accounting, set once the first token is out
    (before the first delta is delivered), so a stream can report it up front.
    """

    prompt_usage: Usage | None = None

    def __init__(
        self, request_id: str, engine: AsyncEngine, loop: asyncio.AbstractEventLoop, prompt: Sequence[int] = ()
    ) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._result: asyncio.Future[RequestOutput] = loop.create_future()
        self._prompt = tuple(prompt)
        self._tokens: list[int] = []
        self._text: list[str] = []
        self._submitted = time.monotonic()

    async def __aiter__(self) -> AsyncIterator[TokenDelta]:
        while True:
            item = await self._queue.get()
            if item is _DONE:
                return
            yield item

    async def result(self) -> RequestOutput:
        return await asyncio.shield(self._result)

    @property
    def done(self) -> bool:
        return self._result.done()

    def cancel(self) -> None:
        if not self._result.done():
            self._engine.abort(self.request_id)

    def _push(self, out: StepOutput) -> None:
        if self._result.done():
            return  # failed from the loop side already (see _fail)
        if out.prompt_usage is not None:
            self.prompt_usage = out.prompt_usage
        if out.token_ids or out.text:
            self._tokens.extend(out.token_ids)
            self._text.append(out.text)
            self._queue.put_nowait(TokenDelta(out.token_ids, out.text))
        if out.finished is not None:
            self._result.set_result(out.finished)
            self._queue.put_nowait(_DONE)

    def _fail(self, message: str, kind: ErrorKind) -> None:
        """End the request from the event loop, when the engine thread can no longer: the counts known here."""
        if self._result.done():
            return
        known = self.prompt_usage
        usage = Usage(
            prompt_tokens=len(self._prompt),
            cached_tokens=known.cached_tokens if known else 0,
            cache_write_tokens=known.cache_write_tokens if known else 0,
            completion_tokens=len(self._tokens),
            cached_tokens_by_tier=dict(known.cached_tokens_by_tier) if known else {},
            cache_write_tokens_by_ttl=dict(known.cache_write_tokens_by_ttl) if known else {},
        )
        output = RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self._prompt,
            token_ids=tuple(self._tokens),
            text="".join(self._text),
            finish_reason="error",
            usage=usage,
            latency_s=time.monotonic() - self._submitted,
            error=message,
            error_kind=kind,
        )
        self._result.set_result(output)
        self._queue.put_nowait(_DONE)


class AsyncEngine:
    """The embedded engine, stepping in a background thread.

    Attributes once started: model_id (served name), tokenizer (a Hugging Face
    fast tokenizer), max_model_len, block_size, clock, core (the sync Engine).
    """

    def __init__(self, settings: EngineSettings | None = None, *, clock: Clock | None = None) -> None:
        self.settings = settings or EngineSettings()
        self._clock = clock
        self.core: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._wake = threading.Condition()
        self._inbox: list[tuple[str, Any]] = []
        self._handles: dict[str, RequestHandle] = {}
        self._stopping = False
        self._dead_reason: str | None = None
        self._publisher: KVEventPublisher | None = None
        # Grammar compiling, off the loop and the engine thread: a few threads in all (llguidance
        # drops the GIL while it builds), and one compile per tenant at a time (_compile_gates).
        self._compile_pool = ThreadPoolExecutor(
            max_workers=self.settings.grammar_compile_threads, thread_name_prefix="kvgate-grammar-compile"
        )
        self._compile_gates: dict[str, asyncio.Semaphore] = {}
        per_tenant = self.settings.max_waiting_per_tenant
        self._max_waiting_per_tenant = per_tenant if per_tenant is not None else max(1, self.settings.max_waiting // 2)

    @classmethod
    def from_settings(cls, settings: EngineSettings | None = None, *, clock: Clock | None = None) -> AsyncEngine:
        return cls(settings, clock=clock)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Load the model and start stepping, both in the engine thread."""
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.Thread(target=self._main, args=(ready,), name="kvgate-engine", daemon=True)
        self._thread.start()
        await ready

    def _main(self, ready: asyncio.Future[None]) -> None:
        # Every torch op of the engine runs on this one thread. Work on a second thread
        # (loading on a pool worker, say) leaves a second OpenMP team behind, and on a
        # small machine the two teams halve decode speed.
        loop = self._loop
        assert loop is not None
        try:
            self.core = Engine(self.settings, clock=self._clock)
            self._publisher = attach_publisher(self.core)
        except BaseException as exc:
            loop.call_soon_threadsafe(ready.set_exception, exc)
            return
        loop.call_soon_threadsafe(ready.set_result, None)
        # llguidance's view of the vocabulary takes a few tenths of a second of GIL-holding work:
        # built now, on a compile thread, not by the first request's compile, when the loop is busy.
        self._compile_pool.submit(self.core.structured.warm)
        try:
            self._run()
        except BaseException as exc:  # a bug in the loop itself: never die silently
            self._die(exc)

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop stepping (requests in flight end "cancelled"), then close the core (KV write-out).

        With timeout_s this returns within about that long whatever the engine does: if its
        thread is stuck, the requests still in flight are failed from here and the core is
        left unclosed; a write-out still running then is abandoned (a record cut short never
        loads: see docs/architecture.md).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._compile_pool.shutdown(wait=False, cancel_futures=True)
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, _left(deadline))
            if thread.is_alive():
                log.error("engine_thread_stuck_at_shutdown", in_flight=len(self._handles))
                self._fail_handles("the engine did not stop in time", "unavailable")
                return
            self._thread = None
        if self.core is not None:
            await _bounded(self.core.close, _left(deadline), what="engine_close")
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            left = _left(deadline)
            await _bounded(lambda: publisher.close(5.0 if left is None else left), left, what="kv_events_close")

    # -- properties ---------------------------------------------------------------------

    @property
    def _engine(self) -> Engine:
        assert self.core is not None, "AsyncEngine.start() has not run"
        return self.core

    @property
    def model_id(self) -> str:
        return self._engine.model_id

    @property
    def tokenizer(self) -> Any:
        return self._engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def block_size(self) -> int:
        return self._engine.block_size

    @property
    def clock(self) -> Clock:
        return self._engine.clock

    @property
    def dead_reason(self) -> str | None:
        """Why the engine thread died, or None while it serves (or was stopped by shutdown)."""
        thread = self._thread
        if self._dead_reason is None and thread is not None and not thread.is_alive() and not self._stopping:
            return "the engine thread is not running"
        return self._dead_reason

    @property
    def supports_tools(self) -> bool:
        template = getattr(self.tokenizer, "chat_template", None) or ""
        return "tools" in template

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> str:
        """Render messages (and tools, if the template supports them) with the generation prompt."""
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def stats(self) -> EngineStats | None:
        """A snapshot of the engine's counters and gauges; None before start()."""
        return make_engine_stats(self.core) if self.core is not None else None

    async def check_health(self) -> None:
        """Raise EngineUnavailableError unless the engine is started, stepping, and not shutting down
        (its message gives dead_reason once the thread has died)."""
        if self.core is None or self._thread is None:
            raise EngineUnavailableError("the engine is not running")
        self._check_serving()

    # -- requests -----------------------------------------------------------------------

    async def prepare(self, params: SamplingParams, *, share: FairShare | None = None) -> None:
        """Compile params' grammar, if it has one not yet compiled, on a compile thread: call before submit.

        Bounded three ways: the static limits of inference.grammar (checked first, at once),
        one compile at a time per tenant (share.key), and KVGATE_GRAMMAR_COMPILE_TIMEOUT_S;
        each refusal is an InvalidRequestError naming the limit. A compile that times out
        keeps its tenant's turn until its thread is done, so a tenant cannot pile them up.
        """
        spec = params.structured
        if not isinstance(spec, StructuredOutput) or self.core is None or self.core.structured.is_compiled(spec):
            return
        structured = self.core.structured
        key = share.key if share is not None else ""
        gate = self._compile_gates.setdefault(key, asyncio.Semaphore(1))
        timeout_s = self.settings.grammar_compile_timeout_s
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            await asyncio.wait_for(gate.acquire(), timeout_s)
        except TimeoutError:
            raise GrammarLimitError(self._compile_timeout_message(timeout_s)) from None
        job = loop.run_in_executor(self._compile_pool, structured.compile, spec)
        job.add_done_callback(lambda _: gate.release())  # (one gate per tenant key, kept: tenants are few)
        try:
            await asyncio.wait_for(asyncio.shield(job), max(0.0, timeout_s - (time.monotonic() - started)))
        except TimeoutError:
            log.warning("grammar_compile_timed_out", timeout_s=timeout_s, kind=spec.kind, chars=len(spec.value))
            raise GrammarLimitError(self._compile_timeout_message(timeout_s)) from None

    @staticmethod
    def _compile_timeout_message(timeout_s: float) -> str:
        return f"the schema or grammar did not compile within {timeout_s:g} s (KVGATE_GRAMMAR_COMPILE_TIMEOUT_S)"

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
        share: FairShare | None = None,
    ) -> RequestHandle:
        """Queue a request. Raises InvalidRequestError, EngineOverloadedError or EngineUnavailableError at once.

        A grammar not compiled by prepare() is compiled here, on the caller's thread: servers
        await prepare() first; this is for direct callers.
        """
        engine = self._engine
        assert self._loop is not None
        self._check_serving()
        engine.validate(prompt_token_ids, params, cache)
        rid = request_id or f"req-{uuid.uuid4().hex}"
        with self._wake:
            self._check_serving()  # again under the lock: _die fails exactly the handles it finds
            waiting = engine.num_waiting + sum(1 for kind, _ in self._inbox if kind == "add")
            if waiting >= self.settings.max_waiting:
                raise EngineOverloadedError(f"{waiting} requests are already waiting")
            if share is not None:  # one tenant's flood fills its own share of the queue, not everyone's
                theirs = engine.num_waiting_for(share.key) + sum(
                    1
                    for kind, item in self._inbox
                    if kind == "add" and item[4] is not None and item[4].key == share.key
                )
                if theirs >= self._max_waiting_per_tenant:
                    raise EngineOverloadedError(f"{theirs} of this tenant's requests are already waiting")
            if rid in self._handles:
                raise EngineError(f"request id {rid!r} is already in use")
            handle = RequestHandle(rid, self, self._loop, prompt_token_ids)
            self._handles[rid] = handle
            self._inbox.append(("add", (rid, list(prompt_token_ids), params, cache, share)))
            self._wake.notify()
        return handle

    async def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, cache: CacheSpec | None = None
    ) -> RequestOutput:
        """Submit and wait for the final output."""
        await self.prepare(params)
        return await self.submit(prompt_token_ids, params, cache or CacheSpec()).result()

    def _check_serving(self) -> None:
        reason = self.dead_reason
        if reason is not None:
            raise EngineUnavailableError(f"the engine is not running: {reason}")
        if self._stopping:
            raise EngineUnavailableError("the engine is shutting down")

    def abort(self, request_id: str) -> None:
        """Stop a request (no-op if it already finished); its handle's result() says "cancelled"."""
        with self._wake:
            self._inbox.append(("abort", request_id))
            self._wake.notify()

    # -- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        engine = self._engine
        # With KV events, an idle engine still wakes up to publish expiries.
        idle_wait_s = None if engine.kv_events is None else engine.kv_events.sweep_interval_s
        while True:
            idle = False
            with self._wake:
                while not self._inbox and not engine.has_unfinished() and not self._stopping:
                    if not self._wake.wait(idle_wait_s):
                        idle = True
                        break
                if self._stopping:
                    break
                if not idle:  # (idle: what arrived since the wait timed out waits for the next turn)
                    inbox, self._inbox = self._inbox, []
            if idle:
                engine.kv_events_tick()
                continue
            outputs = self._apply(engine, inbox)
            try:
                outputs.extend(engine.step())
            except Exception as exc:
                # Engine.step fails a request whose own work raises; what reaches here is a fault
                # of the step itself. Fail what is in flight and keep serving.
                log.exception("engine_step_failed")
                outputs.extend(self._fail_all(engine, f"the engine failed: {type(exc).__name__}: {exc}"))
            if outputs:
                self._dispatch(outputs)
        outputs = [o for rid in list(self._handles) if (o := engine.abort(rid)) is not None]
        self._dispatch(outputs)

    def _apply(self, engine: Engine, inbox: list[tuple[str, Any]]) -> list[StepOutput]:
        """Admit and abort what the loop sent; a request that fails to be admitted fails alone."""
        outputs: list[StepOutput] = []
        for kind, payload in inbox:
            if kind == "add":
                rid, prompt, params, cache, share = payload
                try:
                    engine.add_request(rid, prompt, params, cache, share=share)
                except EngineError as exc:
                    outputs.append(self._rejected(rid, prompt, str(exc), "invalid_request"))
                except Exception as exc:
                    log.error("request_admission_failed", request_id=rid, exc_info=exc)
                    message = f"the engine failed to admit this request: {type(exc).__name__}: {exc}"
                    outputs.append(self._rejected(rid, prompt, message, "internal"))
            else:
                out = engine.abort(payload)
                if out is not None:
                    outputs.append(out)
        return outputs

    @staticmethod
    def _rejected(request_id: str, prompt: list[int], message: str, kind: ErrorKind) -> StepOutput:
        usage = Usage(prompt_tokens=len(prompt), cached_tokens=0, cache_write_tokens=0, completion_tokens=0)
        output = RequestOutput(
            request_id=request_id,
            prompt_token_ids=tuple(prompt),
            token_ids=(),
            text="",
            finish_reason="error",
            usage=usage,
            error=message,
            error_kind=kind,
        )
        return StepOutput(request_id, (), "", finished=output)

    def _fail_all(self, engine: Engine, message: str) -> list[StepOutput]:
        ids = dict.fromkeys([*engine.unfinished_ids, *self._handles])
        return [out for rid in ids if (out := engine.abort(rid, reason="error", error=message)) is not None]

    def _die(self, exc: BaseException) -> None:
        """The engine thread is ending on an exception: say so once, and fail everything in flight now."""
        reason = f"{type(exc).__name__}: {exc}"
        with self._wake:
            self._dead_reason = reason
            handles = list(self._handles.values())
            self._inbox = []
        log.critical("engine_thread_died", reason=reason, in_flight=len(handles), exc_info=exc)
        message = f"the engine stopped: {reason}"
        outputs: list[StepOutput] = []
        for handle in handles:
            try:  # the core's own accounting of what was computed, if it can still give it
                out = self._engine.abort(handle.request_id, reason="error", error=message, error_kind="unavailable")
            except Exception:
                out = None
            if out is not None:
                outputs.append(out)
        try:
            self._dispatch(outputs)
        finally:
            self._fail_handles(message, "unavailable")

    def _fail_handles(self, message: str, kind: ErrorKind) -> None:
        """Fail every request still in flight from the event loop, after the outputs already on their way."""
        with self._wake:
            handles, self._handles = list(self._handles.values()), {}
        loop = self._loop
        for handle in handles:
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(handle._fail, message, kind)

    def _dispatch(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            if out.finished is not None:
                handle = self._handles.pop(out.request_id, None)
            else:
                handle = self._handles.get(out.request_id)
            if handle is not None:
                loop = self._loop
                assert loop is not None
                if not loop.is_closed():
                    loop.call_soon_threadsafe(handle._push, out)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


async def _bounded(work: Callable[[], None], timeout_s: float | None, *, what: str) -> None:
    """Run blocking work in a daemon thread and wait at most timeout_s for it.

    Not asyncio.to_thread: the default executor's threads are joined when the loop and the
    interpreter exit, so work that never ends there would keep the process alive.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish(exc: BaseException | None) -> None:
        if not done.done():
            done.set_exception(exc) if exc is not None else done.set_result(None)

    def run() -> None:
        error: BaseException | None = None
        try:
            work()
        except BaseException as exc:
            error = exc
        if not loop.is_closed():
            loop.call_soon_threadsafe(finish, error)

    threading.Thread(target=run, name=f"kvgate-{what}", daemon=True).start()
    try:
        await asyncio.wait_for(asyncio.shield(done), timeout_s)
    except TimeoutError:
        log.error("shutdown_step_cut_short", step=what, timeout_s=timeout_s)
    except Exception:
        log.exception("shutdown_step_failed", step=what)
