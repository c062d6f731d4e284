"""From a /v1/responses body to what the engine needs, and the conversation a stored response continues.

responses_job runs like the other prepare jobs (inline for small bodies, in a request worker
for large ones) and touches no database. A request with previous_response_id is prepared in
two steps: the first pass parses and checks the body and renders nothing; the route loads the
earlier response's conversation (gateway.responses_store) and runs the job again with it as
`history`, so that the rendered prompt begins with the earlier turn's prompt and reads it from
the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gateway.generation import Prepared, output_budget
from gateway.prompt import Chat
from gateway.protocols import responses
from gateway.protocols.openai_caching import CachePlan
from gateway.protocols.responses import CanonicalItem, ResponseSettings, ResponsesRequest
from gateway.protocols.responses_tools import check_calls, tool_defs
from gateway.protocols.structured import json_schema_output, openai_structured
from gateway.request_body import decode_body
from gateway.services.cache_diagnostics import FingerprintJob, fingerprint_job
from gateway.services.completions import PrepareContext, check_model, sampling_params, with_tools
from inference.types import StructuredOutput


@dataclass(frozen=True)
class PreparedResponse:
    settings: ResponseSettings
    input_items: tuple[CanonicalItem, ...]  # this request's input, canonical
    context: tuple[CanonicalItem, ...]  # the whole conversation rendered: history + input_items
    prepared: Prepared | None  # None until the history of previous_response_id is in
    stream: bool
    fingerprint: FingerprintJob | None = None  # with prepared


def structured_output(request: ResponsesRequest) -> StructuredOutput | None:
    fmt = request.text.format if request.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return openai_structured({"type": "json_object"}, param="text.format")
    return json_schema_output(fmt.schema_, strict=bool(fmt.strict), param="text.format")


def response_chat(request: ResponsesRequest, context: list[CanonicalItem]) -> Chat:
    check_calls(context)
    return responses.to_chat(request.instructions, context, tool_defs(request.tools), responses.choice_of(request))


def prepare_response(
    ctx: PrepareContext, *, request: ResponsesRequest, context: list[CanonicalItem], chat: Chat | None = None
) -> Prepared:
    """`chat`: response_chat's, when the caller has made it already."""
    model = check_model(ctx, model=request.model)
    plan = CachePlan(options=request.prompt_cache_options, retention=request.prompt_cache_retention)
    chat = chat or response_chat(request, context)
    prompt = ctx.renderer.render(chat)
    sampling = sampling_params(
        max_tokens=output_budget(
            ctx.max_model_len, prompt_tokens=len(prompt.token_ids), requested=request.max_output_tokens
        ),
        temperature=request.temperature,
        top_p=request.top_p,
    )
    structured = structured_output(request)
    if structured is not None:
        sampling = replace(sampling, structured=structured)
    sampling, tools = with_tools(chat, sampling, ctx.renderer)
    if tools is not None and request.max_tool_calls is not None:
        tools = replace(tools, max_calls=min(tools.max_calls or request.max_tool_calls, request.max_tool_calls))
    # Input parts carry no breakpoints here (prompt_cache_breakpoint is refused on /v1/responses), so the
    # request-level controls decide: automatic caching with the options' TTL, or nothing in explicit mode.
    regions = plan.regions([], prompt_tokens=len(prompt.token_ids), min_tokens=ctx.min_cacheable_tokens)
    return Prepared(model, prompt, sampling, regions, request.cache_salt, tools)


def responses_job(
    ctx: PrepareContext,
    raw: bytes,
    content_type: str | None,
    *,
    history: tuple[CanonicalItem, ...] | None = None,
    body: type[ResponsesRequest] = ResponsesRequest,
) -> PreparedResponse:
    """Parse and check the body; render it unless it continues a response whose history is not in yet.

    body=InputTokensRequest (/v1/responses/input_tokens): the same, with the model optional."""
    request = decode_body(raw, content_type=content_type, model=body)
    if request.model is None:
        request = request.model_copy(update={"model": ctx.model_id})
    responses.check_supported(request)
    model = check_model(ctx, model=request.model)
    structured_output(request)  # refused before any database work, not after it
    items = responses.canonical_input(request)
    waiting = request.previous_response_id is not None and history is None
    context = [*(history or ()), *items]
    prepared = fingerprint = None
    if not waiting:
        chat = response_chat(request, context)
        prepared = prepare_response(ctx, request=request, context=context, chat=chat)
        options = request.prompt_cache_options
        fingerprint = fingerprint_job(
            ctx.renderer,
            chat,
            prepared.prompt,
            model=model,
            client_salt=request.cache_salt,
            compare_to=options.comparison_response_id if options else None,
        )
    return PreparedResponse(
        settings=responses.settings_of(request, model),
        input_items=tuple(items),
        context=tuple(context),
        prepared=prepared,
        stream=bool(request.stream),
        fingerprint=fingerprint,
    )


def input_tokens_job(
    ctx: PrepareContext, raw: bytes, content_type: str | None, *, history: tuple[CanonicalItem, ...] | None = None
) -> PreparedResponse:
    """responses_job for /v1/responses/input_tokens: what the same Responses request would render."""
    return responses_job(ctx, raw, content_type, history=history, body=responses.InputTokensRequest)
