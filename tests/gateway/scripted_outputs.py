"""The real engine with scripted output text, for tests of what the gateway makes of a model's output.

Requests run on the real engine as always (rendering, prefill, the prefix cache and
every count are real); while the test has texts queued, the next request's output
text is replaced by the next one, streamed in small chunks so tags split across
deltas. A random-weight model never writes a tool call by itself: this is how the
tool-call paths get one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from inference.types import CacheSpec, RequestOutput, SamplingParams, TokenDelta


class ScriptedHandle:
    def __init__(self, handle: Any, text: str, chunk: int) -> None:
        self._handle = handle
        self._text = text
        self._chunk = chunk

    @property
    def request_id(self) -> str:
        return self._handle.request_id

    @property
    def prompt_usage(self) -> Any:
        return self._handle.prompt_usage

    async def __aiter__(self) -> AsyncIterator[TokenDelta]:
        async for _ in self._handle:  # the real generation runs to its end first
            pass
        for i in range(0, len(self._text), self._chunk):
            yield TokenDelta(token_ids=(), text=self._text[i : i + self._chunk])

    async def result(self) -> RequestOutput:
        output = await self._handle.result()
        finish = "stop" if output.finish_reason == "length" else output.finish_reason
        return replace(output, text=self._text, finish_reason=finish)

    def cancel(self) -> None:
        self._handle.cancel()


class ScriptedOutputs:
    """Wraps an EngineClient; `script` holds the output texts of the next requests, in order."""

    def __init__(self, engine: Any, chunk: int = 3) -> None:
        self._engine = engine
        self._chunk = chunk
        self.script: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
        share: Any = None,
    ) -> Any:
        handle = self._engine.submit(prompt_token_ids, params, cache, request_id=request_id, share=share)
        return ScriptedHandle(handle, self.script.pop(0), self._chunk) if self.script else handle
