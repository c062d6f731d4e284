"""From an API request body to what the engine needs: parsing, model check, rendering, sampling, cache regions.

The jobs (message_job, chat_job, count_tokens_job) take the raw body and a
PrepareContext and return small, picklable results, so that a large body can be
handled in a worker process (gateway.request_workers) exactly as a small one is
on the event loop. Nothing in them touches the database or billing: the one
billing check (a 24h prompt_cache_retention) runs on the loop afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gateway.cache_regions import breakpoint_regions
from gateway.generation import Prepared, output_budget
from gateway.prompt import Chat, PromptRenderer
from gateway.protocols import anthropic, openai
from gateway.protocols.openai_caching import RETENTION_TTL_S, CachePlan
from gateway.protocols.structured import anthropic_structured, openai_structured
from gateway.request_body import decode_body
from gateway.services.cache_diagnostics import FingerprintJob, fingerprint_job
from gateway.tools.choice import forcing_grammar
from gateway.tools.parse import ToolParsing, parsing_for
from inference.types import SamplingParams, StructuredOutput
from kvgate.errors import InvalidRequestError, ModelNotFoundError
from kvgate.usage import STANDARD_TTLS_S

if TYPE_CHECKING:
    from gateway.state import Gateway

# Below this a temperature is greedy and a top_p keeps only the top token (vLLM's
# epsilon); passing smaller values through would divide logits into inf/nan.
SAMPLING_EPS = 1e-5


@dataclass(frozen=True)
class PrepareContext:
    """What preparing a request needs: the served model, its context, the renderer, the caching minimum."""

    model_id: str
    max_model_len: int
    min_cacheable_tokens: int
    renderer: PromptRenderer


@dataclass(frozen=True)
class PreparedMessage:
    prepared: Prepared
    stream: bool
    fingerprint: FingerprintJob


@dataclass(frozen=True)
class PreparedChat:
    prepared: Prepared
    stream: bool
    include_usage: bool
    retention: str | None  # prompt_cache_retention as sent; see check_retention
    fingerprint: FingerprintJob


def sampling_params(
    *,
    max_tokens: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: tuple[str, ...] = (),
    structured: StructuredOutput | None = None,
) -> SamplingParams:
    t = 1.0 if temperature is None else temperature
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0 if t < SAMPLING_EPS else t,
        top_p=1.0 if top_p is None else max(top_p, SAMPLING_EPS),
        top_k=top_k or 0,
        seed=seed,
        stop=tuple(s for s in stop if s),
        structured=structured,
    )


def with_tools(
    chat: Chat, sampling: SamplingParams, renderer: PromptRenderer
) -> tuple[SamplingParams, ToolParsing | None]:
    """The sampling with the grammar a forced tool_choice needs, and what to parse from the output."""
    definitions = [t.definition for t in chat.tools]
    grammar = forcing_grammar(definitions, chat.tool_choice, renderer.added_token)
    if grammar is not None:
        sampling = replace(sampling, structured=grammar)
    return sampling, parsing_for(definitions, chat.tool_choice)


def check_model(ctx: PrepareContext, *, model: str) -> str:
    if model != ctx.model_id:
        raise ModelNotFoundError(f"model: {model}", param="model")
    return model


def count_message_tokens(ctx: PrepareContext, *, request: anthropic.CountTokensRequest) -> int:
    check_model(ctx, model=request.model)
    return len(ctx.renderer.render(anthropic.to_chat(request)).token_ids)


def prepare_message(ctx: PrepareContext, *, request: anthropic.MessagesRequest, chat: Chat | None = None) -> Prepared:
    """`chat`: the request's, when the caller has made it already."""
    model = check_model(ctx, model=request.model)
    chat = chat or anthropic.to_chat(request)
    prompt = ctx.renderer.render(chat)
    sampling = sampling_params(
        max_tokens=output_budget(ctx.max_model_len, prompt_tokens=len(prompt.token_ids), requested=request.max_tokens),
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        stop=tuple(request.stop_sequences or ()),
        structured=anthropic_structured(request.output_config),
    )
    sampling, tools = with_tools(chat, sampling, ctx.renderer)
    regions = breakpoint_regions(prompt.breakpoints, min_tokens=ctx.min_cacheable_tokens)
    return Prepared(model, prompt, sampling, regions, request.cache_salt, tools)


def prepare_chat_completion(
    ctx: PrepareContext, *, request: openai.ChatCompletionRequest, chat: Chat | None = None
) -> Prepared:
    model = check_model(ctx, model=request.model)
    plan = CachePlan(options=request.prompt_cache_options, retention=request.prompt_cache_retention)
    chat = chat or openai.to_chat(request)
    prompt = ctx.renderer.render(chat)
    sampling = sampling_params(
        max_tokens=output_budget(
            ctx.max_model_len, prompt_tokens=len(prompt.token_ids), requested=request.requested_max_tokens
        ),
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop_sequences,
        structured=openai_structured(request.response_format),
    )
    sampling, tools = with_tools(chat, sampling, ctx.renderer)
    regions = plan.regions(prompt.breakpoints, prompt_tokens=len(prompt.token_ids), min_tokens=ctx.min_cacheable_tokens)
    return Prepared(model, prompt, sampling, regions, request.cache_salt, tools)


def check_retention(gw: Gateway, *, model: str, retention: str | None) -> None:
    """A prompt_cache_retention past 1h needs billing to price its TTL class."""
    ttl_s = RETENTION_TTL_S[retention or "in_memory"]
    if ttl_s not in STANDARD_TTLS_S and not gw.billing.allows_ttl(model=model, ttl_s=ttl_s):
        raise InvalidRequestError(
            f"prompt_cache_retention: {retention!r} is not enabled on this server", param="prompt_cache_retention"
        )


# -- jobs: raw body in, small picklable result out ---------------------------------------------------


def message_job(ctx: PrepareContext, raw: bytes, content_type: str | None) -> PreparedMessage:
    request = decode_body(raw, content_type=content_type, model=anthropic.MessagesRequest)
    check_model(ctx, model=request.model)  # an unknown model is named before anything in the body
    chat = anthropic.to_chat(request)
    prepared = prepare_message(ctx, request=request, chat=chat)
    compare_to = request.diagnostics.previous_message_id if request.diagnostics else None
    fingerprint = fingerprint_job(
        ctx.renderer,
        chat,
        prepared.prompt,
        model=prepared.model,
        client_salt=request.cache_salt,
        compare_to=compare_to,
    )
    return PreparedMessage(prepared, stream=request.stream, fingerprint=fingerprint)


def count_tokens_job(ctx: PrepareContext, raw: bytes, content_type: str | None) -> int:
    request = decode_body(raw, content_type=content_type, model=anthropic.CountTokensRequest)
    return count_message_tokens(ctx, request=request)


def chat_job(ctx: PrepareContext, raw: bytes, content_type: str | None) -> PreparedChat:
    request = decode_body(raw, content_type=content_type, model=openai.ChatCompletionRequest)
    chat = openai.to_chat(request)
    prepared = prepare_chat_completion(ctx, request=request, chat=chat)
    fingerprint = fingerprint_job(
        ctx.renderer,
        chat,
        prepared.prompt,
        model=prepared.model,
        client_salt=request.cache_salt,
        compare_to=None,
    )
    return PreparedChat(
        prepared,
        stream=bool(request.stream),
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        retention=request.prompt_cache_retention,
        fingerprint=fingerprint,
    )
