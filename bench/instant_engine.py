"""An engine stand-in that answers at once, for measuring the gateway alone. Benchmarks only: never in tests.

It renders and tokenizes like the real engine (same tokenizer and chat template) and
returns one fixed token, so what a benchmark measures is the gateway's own work. It is an
EngineClient (gateway.backends.base) like the embedded engine, with no cache and no stats.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from inference.stats import EngineStats
from inference.types import CacheSpec, RequestOutput, SamplingParams, TokenDelta, Usage


class InstantHandle:
    prompt_usage: Usage | None = None  # nothing is cached: the stream's first event counts the prompt as input

    def __init__(self, request_id: str, prompt: Sequence[int]) -> None:
        self.request_id = request_id
        self._prompt = tuple(prompt)

    async def __aiter__(self) -> AsyncIterator[TokenDelta]:
        yield TokenDelta(token_ids=(42,), text="ok")

    async def result(self) -> RequestOutput:
        usage = Usage(prompt_tokens=len(self._prompt), cached_tokens=0, cache_write_tokens=0, completion_tokens=1)
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self._prompt,
            token_ids=(42,),
            text="ok",
            finish_reason="length",
            usage=usage,
            ttft_s=0.0,
        )

    def cancel(self) -> None:
        pass


class InstantEngine:
    model_id = "instant"
    block_size = 16
    dead_reason: str | None = None

    def __init__(self, tokenizer_dir: Path, max_model_len: int = 8192) -> None:
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.max_model_len = max_model_len
        self._next = 0

    async def start(self) -> None:
        await asyncio.sleep(0)

    async def shutdown(self, timeout_s: float | None = None) -> None:
        await asyncio.sleep(0)

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)

    async def prepare(self, params: SamplingParams, *, share: object = None) -> None:
        pass  # no grammars to compile

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
        share: object = None,
    ) -> InstantHandle:
        self._next += 1
        return InstantHandle(request_id or f"instant-{self._next}", prompt_token_ids)

    def abort(self, request_id: str) -> None:
        pass  # every request is finished as soon as it is submitted

    async def check_health(self) -> None:
        pass

    def stats(self) -> EngineStats | None:
        return None
