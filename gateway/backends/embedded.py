"""The embedded backend: inference.AsyncEngine, in this process, as an EngineClient."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gateway.backends.base import Handle
from inference.settings import EngineSettings
from inference.stats import EngineStats
from inference.types import CacheSpec, FairShare, SamplingParams

if TYPE_CHECKING:
    from inference.async_engine import AsyncEngine


class EmbeddedEngine:
    """AsyncEngine behind the EngineClient Protocol; `engine` is the AsyncEngine itself."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    @classmethod
    def from_settings(cls, settings: EngineSettings | None = None) -> EmbeddedEngine:
        """The engine `kvgate serve` runs: settings from the KVGATE_* environment unless given."""
        # Imported here, so that importing the app (and `kvgate --help`) does not load torch.
        from inference.async_engine import AsyncEngine

        return cls(AsyncEngine.from_settings(settings))

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    async def start(self) -> None:
        await self.engine.start()

    async def shutdown(self, timeout_s: float | None = None) -> None:
        await self.engine.shutdown(timeout_s=timeout_s)

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> str:
        return self.engine.apply_chat_template(messages, tools=tools)

    async def prepare(self, params: SamplingParams, *, share: FairShare | None = None) -> None:
        await self.engine.prepare(params, share=share)

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
        share: FairShare | None = None,
    ) -> Handle:
        return self.engine.submit(prompt_token_ids, params, cache, request_id=request_id, share=share)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def check_health(self) -> None:
        await self.engine.check_health()

    def stats(self) -> EngineStats | None:
        return self.engine.stats()
