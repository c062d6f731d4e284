"""The engine's asyncio interface: what the gateway and the engine server call.

The engine core steps in one background thread (torch releases the GIL in its
kernels, so the event loop stays responsive). Requests and aborts reach it through
a locked inbox; its outputs come back to the loop with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog

from inference.clock import Clock
from inference.engine import Engine, StepOutput
from inference.settings import EngineSettings
from inference.stats import EngineStats, make_engine_stats
from inference.types import (
    CacheSpec,
    EngineError,
    EngineOverloadedError,
    RequestOutput,
    SamplingParams,
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

    def __init__(self, request_id: str, engine: AsyncEngine, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._result: asyncio.Future[RequestOutput] = loop.create_future()

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
        if out.prompt_usage is not None:
            self.prompt_usage = out.prompt_usage
        if out.token_ids or out.text:
            self._queue.put_nowait(TokenDelta(out.token_ids, out.text))
        if out.finished is not None and not self._result.done():
            self._result.set_result(out.finished)
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
        except BaseException as exc:
            loop.call_soon_threadsafe(ready.set_exception, exc)
            return
        loop.call_soon_threadsafe(ready.set_result, None)
        self._run()

    async def shutdown(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self.core is not None:
            await asyncio.to_thread(self.core.close)

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
        """Raise EngineError unless the engine is started, stepping, and not shutting down."""
        if self.core is None or self._thread is None or not self._thread.is_alive() or self._stopping:
            raise EngineError("the engine is not running")

    # -- requests -----------------------------------------------------------------------

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
    ) -> RequestHandle:
        """Queue a request. Raises InvalidRequestError or EngineOverloadedError at once."""
        engine = self._engine
        assert self._loop is not None
        if self._stopping:
            raise EngineOverloadedError("the engine is shutting down")
        engine.validate(prompt_token_ids, params, cache)
        rid = request_id or f"req-{uuid.uuid4().hex}"
        with self._wake:
            waiting = engine.num_waiting + sum(1 for kind, _ in self._inbox if kind == "add")
            if waiting >= self.settings.max_waiting:
                raise EngineOverloadedError(f"{waiting} requests are already waiting")
            if rid in self._handles:
                raise EngineError(f"request id {rid!r} is already in use")
            handle = RequestHandle(rid, self, self._loop)
            self._handles[rid] = handle
            self._inbox.append(("add", (rid, list(prompt_token_ids), params, cache)))
            self._wake.notify()
        return handle

    async def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, cache: CacheSpec | None = None
    ) -> RequestOutput:
        """Submit and wait for the final output."""
        return await self.submit(prompt_token_ids, params, cache or CacheSpec()).result()

    def abort(self, request_id: str) -> None:
        """Stop a request (no-op if it already finished); its handle's result() says "cancelled"."""
        with self._wake:
            self._inbox.append(("abort", request_id))
            self._wake.notify()

    # -- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        engine = self._engine
        while True:
            with self._wake:
                while not self._inbox and not engine.has_unfinished() and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    break
                inbox, self._inbox = self._inbox, []
            outputs = self._apply(engine, inbox)
            try:
                outputs.extend(engine.step())
            except Exception as exc:  # a bug must not hang every caller: fail what is in flight
                log.exception("engine_step_failed")
                outputs.extend(self._fail_all(engine, f"engine error: {exc}"))
            if outputs:
                self._dispatch(outputs)
        outputs = [o for rid in list(self._handles) if (o := engine.abort(rid)) is not None]
        self._dispatch(outputs)

    def _apply(self, engine: Engine, inbox: list[tuple[str, Any]]) -> list[StepOutput]:
        outputs: list[StepOutput] = []
        for kind, payload in inbox:
            if kind == "add":
                rid, prompt, params, cache = payload
                try:
                    engine.add_request(rid, prompt, params, cache)
                except EngineError as exc:
                    outputs.append(self._rejected(rid, prompt, str(exc)))
            else:
                out = engine.abort(payload)
                if out is not None:
                    outputs.append(out)
        return outputs

    @staticmethod
    def _rejected(request_id: str, prompt: list[int], message: str) -> StepOutput:
        usage = Usage(prompt_tokens=len(prompt), cached_tokens=0, cache_write_tokens=0, completion_tokens=0)
        output = RequestOutput(
            request_id=request_id,
            prompt_token_ids=tuple(prompt),
            token_ids=(),
            text="",
            finish_reason="error",
            usage=usage,
            error=message,
        )
        return StepOutput(request_id, (), "", finished=output)

    def _fail_all(self, engine: Engine, message: str) -> list[StepOutput]:
        return [
            out for rid in list(self._handles) if (out := engine.abort(rid, reason="error", error=message)) is not None
        ]

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
