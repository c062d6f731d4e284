"""What the gateway needs from an inference engine (inference.AsyncEngine satisfies it).

Written as a Protocol so the benchmark can stand in an instant-answer engine; tests
always use the real one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from inference.types import CacheSpec, RequestOutput, SamplingParams, TokenDelta


class Handle(Protocol):
    request_id: str

    def __aiter__(self) -> AsyncIterator[TokenDelta]: ...

    async def result(self) -> RequestOutput: ...

    def cancel(self) -> None: ...


class Engine(Protocol):
    model_id: str
    max_model_len: int
    tokenizer: Any
    # Why the engine can no longer serve (its thread died), or None: /healthz and admission read it.
    dead_reason: str | None

    async def start(self) -> None: ...

    async def shutdown(self, timeout_s: float | None = None) -> None: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None
    ) -> str: ...

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
    ) -> Handle: ...
