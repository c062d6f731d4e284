"""What the gateway needs from an inference engine: the EngineClient Protocol and its request Handle.

Gateway code talks to engines only through these. The embedded engine is adapted in
gateway.backends.embedded; the benchmark's instant stand-in (bench/instant_engine.py)
satisfies them too. Tests always use the real engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, NamedTuple, Protocol

from inference.stats import EngineStats
from inference.types import CacheSpec, FairShare, RequestOutput, SamplingParams, TokenDelta, Usage


class Placement(NamedTuple):
    """Where a request ran, for its usage record. A Handle may carry one as `placement` (optional: the
    gateway takes EMBEDDED for a handle without it)."""

    backend: str  # "embedded", "kvgate" (a `kvgate engine serve`), "vllm" (vLLM's OpenAI server)
    engine_id: str  # the engine's id (/kv/info), its base URL where it has none, "embedded" in process
    predicted_cached_tokens: int | None = None  # what the router expected it to read; never billed


EMBEDDED = Placement("embedded", "embedded")


class Handle(Protocol):
    """One submitted request: iterate it for token deltas, await result() for the final output."""

    request_id: str
    # The prompt's cache accounting, once prefill is done (before the first delta arrives); None until then.
    prompt_usage: Usage | None

    def __aiter__(self) -> AsyncIterator[TokenDelta]: ...

    async def result(self) -> RequestOutput: ...

    def cancel(self) -> None:
        """Stop generating; result() then reports finish_reason "cancelled" with the usage so far."""
        ...


class EngineClient(Protocol):
    """An inference engine as the gateway uses it. Attributes are valid once start() has returned."""

    model_id: str
    max_model_len: int
    tokenizer: Any  # a Hugging Face tokenizer: the gateway renders and counts prompts itself

    async def start(self) -> None: ...

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop the engine; with timeout_s, return within about that long whatever it does."""
        ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None
    ) -> str: ...

    async def prepare(self, params: SamplingParams, *, share: FairShare | None = None) -> None:
        """Get ready what submit needs and takes long (a grammar to compile), off the event loop;
        raises inference.types.InvalidRequestError for a schema or grammar over its limits."""
        ...

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
        share: FairShare | None = None,
    ) -> Handle:
        """Queue a request; raises inference.types.EngineOverloadedError, EngineUnavailableError or
        InvalidRequestError at once. share: whose fair-queueing share it runs in."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a request by id (no-op if it already finished)."""
        ...

    async def check_health(self) -> None:
        """Raise inference.types.EngineError if the engine cannot serve requests now (its thread died,
        it is stopping): /healthz says 503 and admission refuses new requests at once."""
        ...

    def stats(self) -> EngineStats | None:
        """A snapshot of the engine's counters and gauges for /metrics; None if the engine has none."""
        ...
