"""From a /v1/completions body to what the engine needs: a raw prompt, no chat template.

Like the chat job (gateway.services.completions), it runs inline or in a request worker and
touches no database; caching is automatic, as for Chat Completions.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.cache_regions import automatic_region
from gateway.generation import Prepared, output_budget
from gateway.prompt import RenderedPrompt
from gateway.protocols import completions
from gateway.protocols.completions import DEFAULT_MAX_TOKENS, CompletionRequest
from gateway.request_body import decode_body
from gateway.services.completions import PrepareContext, check_model, sampling_params
from kvgate.usage import CACHE_5M


@dataclass(frozen=True)
class PreparedCompletion:
    prepared: Prepared
    stream: bool
    include_usage: bool


def prepare_completion(ctx: PrepareContext, *, request: CompletionRequest) -> Prepared:
    model = check_model(ctx, model=request.model)
    completions.check_supported(request)
    prompt = completions.prompt_of(request)
    rendered = ctx.renderer.render_text(prompt) if isinstance(prompt, str) else RenderedPrompt("", prompt)
    requested = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
    sampling = sampling_params(
        max_tokens=output_budget(ctx.max_model_len, prompt_tokens=len(rendered.token_ids), requested=requested),
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop_sequences,
    )
    regions = automatic_region(len(rendered.token_ids), ttl_s=CACHE_5M.seconds, min_tokens=ctx.min_cacheable_tokens)
    return Prepared(model, rendered, sampling, regions, request.cache_salt)


def completion_job(ctx: PrepareContext, raw: bytes, content_type: str | None) -> PreparedCompletion:
    request = decode_body(raw, content_type=content_type, model=CompletionRequest)
    return PreparedCompletion(
        prepare_completion(ctx, request=request),
        stream=bool(request.stream),
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
    )
