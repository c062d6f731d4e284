"""From an API request to what the engine needs: model check, rendering, sampling, cache regions."""

from __future__ import annotations

from gateway.cache_regions import automatic_region, breakpoint_regions
from gateway.generation import Prepared, output_budget
from gateway.protocols import anthropic, openai
from gateway.state import Gateway
from inference.types import SamplingParams
from kvgate.errors import InvalidRequestError, ModelNotFoundError
from kvgate.usage import STANDARD_TTLS_S

# Below this a temperature is greedy and a top_p keeps only the top token (vLLM's
# epsilon); passing smaller values through would divide logits into inf/nan.
SAMPLING_EPS = 1e-5


def sampling_params(
    *,
    max_tokens: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: tuple[str, ...] = (),
) -> SamplingParams:
    t = 1.0 if temperature is None else temperature
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0 if t < SAMPLING_EPS else t,
        top_p=1.0 if top_p is None else max(top_p, SAMPLING_EPS),
        top_k=top_k or 0,
        seed=seed,
        stop=tuple(s for s in stop if s),
    )


def check_model(gw: Gateway, *, model: str) -> str:
    if model != gw.engine.model_id:
        raise ModelNotFoundError(f"model: {model}", param="model")
    return model


def count_message_tokens(gw: Gateway, *, request: anthropic.CountTokensRequest) -> int:
    check_model(gw, model=request.model)
    return len(gw.renderer.render(anthropic.to_chat(request)).token_ids)


def prepare_message(gw: Gateway, *, request: anthropic.MessagesRequest) -> Prepared:
    model = check_model(gw, model=request.model)
    prompt = gw.renderer.render(anthropic.to_chat(request))
    sampling = sampling_params(
        max_tokens=output_budget(gw, prompt_tokens=len(prompt.token_ids), requested=request.max_tokens),
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        stop=tuple(request.stop_sequences or ()),
    )
    regions = breakpoint_regions(prompt.breakpoints, min_tokens=gw.settings.min_cacheable_tokens)
    return Prepared(model, prompt, sampling, regions, request.cache_salt)


def prepare_chat_completion(gw: Gateway, *, request: openai.ChatCompletionRequest) -> Prepared:
    model = check_model(gw, model=request.model)
    ttl_s = openai.RETENTION_TTL_S[request.prompt_cache_retention or "in_memory"]
    if ttl_s not in STANDARD_TTLS_S and not gw.billing.allows_ttl(model=model, ttl_s=ttl_s):
        raise InvalidRequestError(
            f"prompt_cache_retention: {request.prompt_cache_retention!r} is not enabled on this server",
            param="prompt_cache_retention",
        )
    prompt = gw.renderer.render(openai.to_chat(request))
    sampling = sampling_params(
        max_tokens=output_budget(gw, prompt_tokens=len(prompt.token_ids), requested=request.requested_max_tokens),
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop_sequences,
    )
    regions = automatic_region(len(prompt.token_ids), ttl_s=ttl_s, min_tokens=gw.settings.min_cacheable_tokens)
    return Prepared(model, prompt, sampling, regions, request.cache_salt)
