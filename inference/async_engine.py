"""The engine's asyncio interface: what the gateway and the engine server call.

(Interface fixed first so the gateway can be built against it; the implementation
lands with the engine.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from inference.settings import EngineSettings
from inference.types import CacheSpec, RequestOutput, SamplingParams, TokenDelta


class RequestHandle:
    """One submitted request. Iterate it for token deltas; await result() for the final output.

    cancel() stops generation, frees the request's blocks (keeping what it committed);
    result() then returns finish_reason "cancelled" with the usage up to that point.
    """

    request_id: str

    def __aiter__(self) -> AsyncIterator[TokenDelta]:
        raise NotImplementedError

    async def result(self) -> RequestOutput:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError


class AsyncEngine:
    """The embedded engine, stepping in a background thread.

    Attributes once started: model_id (served name), tokenizer (a Hugging Face
    fast tokenizer), max_model_len, block_size.
    """

    model_id: str
    max_model_len: int
    block_size: int
    tokenizer: Any

    @classmethod
    def from_settings(cls, settings: EngineSettings | None = None) -> AsyncEngine:
        raise NotImplementedError

    async def start(self) -> None:
        raise NotImplementedError

    async def shutdown(self) -> None:
        raise NotImplementedError

    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None
    ) -> str:
        """Render messages (and tools, if the template supports them) with the generation prompt."""
        raise NotImplementedError

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
    ) -> RequestHandle:
        """Queue a request. Raises InvalidRequestError or EngineOverloadedError at once."""
        raise NotImplementedError
