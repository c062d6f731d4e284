"""OpenAI's legacy Completions (/v1/completions): the request, the text_completion body and its chunk stream.

The prompt is raw text (or token ids), sent to the model without a chat template. Usage
is Chat Completions' (prompt_tokens_details.cached_tokens, cost_usd).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Annotated, Any, Literal

import structlog
from pydantic import BaseModel, Field

from gateway.api.errors import openai_body
from gateway.generation import Finished, Generation, output_error
from gateway.logs import log_failure
from gateway.protocols.common import INT32_MAX, MaxOutputTokens, Seed, Strict, check_penalties, refuse, stop_tuple
from gateway.protocols.openai import CompletionUsage, FinishReason, StreamOptions, finish_reason
from gateway.protocols.openai_stream import usage_of
from gateway.sse import event

log = structlog.get_logger("kvgate.gateway")

# OpenAI's default when max_tokens is not given (it is 16 on this endpoint, not "as many as fit").
DEFAULT_MAX_TOKENS = 16

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class CompletionRequest(Strict):
    model: str = Field(min_length=1)
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: MaxOutputTokens | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int | None = Field(None, ge=1, le=128)
    best_of: int | None = Field(None, ge=1, le=20)
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[int, Field(ge=-100, le=100)]] | None = Field(None, max_length=1024)
    user: str | None = None
    cache_salt: str | None = Field(
        None, min_length=1, max_length=256, description="Partitions the cache further inside the tenant."
    )

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return stop_tuple(self.stop)


def check_supported(request: CompletionRequest) -> None:
    if (request.n or 1) != 1 or (request.best_of or 1) != 1:
        raise refuse("n", "only n=1 (and best_of=1) is supported")
    if request.echo:
        raise refuse("echo", "echo is not supported")
    if request.logprobs is not None:
        raise refuse("logprobs", "logprobs are not supported")
    if request.suffix:
        raise refuse("suffix", "suffix (insertion) is not supported")
    check_penalties(request.frequency_penalty, request.presence_penalty)
    if request.logit_bias:
        raise refuse("logit_bias", "logit_bias is not supported")
    if len(request.stop_sequences) > 4:
        raise refuse("stop", "at most 4 stop sequences may be given")


def prompt_of(request: CompletionRequest) -> str | list[int]:
    """The one prompt: text, or token ids. A batch of several prompts is a 400."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return prompt
    if not prompt:
        raise refuse("prompt", "the prompt is empty")
    if all(isinstance(p, int) for p in prompt):
        return list(prompt)  # type: ignore[arg-type]
    if len(prompt) != 1:
        raise refuse("prompt", "only one prompt per request is supported")
    return prompt[0]  # type: ignore[return-value]


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: FinishReason


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    system_fingerprint: str | None = None


def completion_id(request_id: str) -> str:
    return "cmpl-" + request_id.removeprefix("req_")


def text_completion_of(finished: Finished, *, request_id: str, model: str, created: int) -> TextCompletion:
    choice = CompletionChoice(text=finished.output.text, finish_reason=finish_reason(finished.output.finish_reason))
    return TextCompletion(
        id=completion_id(request_id), created=created, model=model, choices=[choice], usage=usage_of(finished)
    )


async def completion_chunks(
    gen: Generation, *, request_id: str, model: str, include_usage: bool
) -> AsyncGenerator[bytes, None]:
    base = {"id": completion_id(request_id), "object": "text_completion", "created": int(time.time()), "model": model}
    usage_field: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(text: str, reason: str | None = None) -> bytes:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": reason}
        return event(None, {**base, "choices": [choice], **usage_field})

    done = False
    try:
        async for delta in gen.handle:
            if delta.text:
                yield chunk(delta.text)
        finished = await gen.finish(await gen.handle.result())
        done = True
        if finished.status == "error":
            yield event(None, openai_body(output_error(finished.output)))
            return
        yield chunk("", finish_reason(finished.output.finish_reason))
        if include_usage:
            yield event(None, {**base, "choices": [], "usage": usage_of(finished).model_dump(mode="json")})
        yield event(None, "[DONE]")
    except Exception:
        log_failure(log, "stream_failed", request_id=request_id)
        error = {"message": "Internal server error", "type": "server_error", "param": None, "code": None}
        yield event(None, {"error": error})
    finally:
        if not done:
            gen.abandon()
