"""From a request body to what the engine takes: prompt token ids, sampling params, a cache spec.

Everything the engine cannot honour is refused here with a 400 naming the field,
rather than ignored: a client asking for logprobs or tools must not get a reply that
silently lacks them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import jinja2

from inference.async_engine import AsyncEngine
from inference.grammar import check_structured
from inference.server.errors import bad_request
from inference.server.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingFields,
)
from inference.types import CacheRegion, CacheSpec, FairShare, InvalidRequestError, SamplingParams, StructuredOutput


@dataclass(frozen=True)
class EngineInputs:
    prompt_token_ids: list[int]
    params: SamplingParams
    cache: CacheSpec
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # every chunk carries the usage so far (vLLM's continuous_usage_stats)
    share: FairShare | None = None  # the gateway's tenant and weight (fair queueing)


def check_model(requested: str | None, served: str) -> None:
    # vLLM and OpenAI answer 404 here; the engine issue asks for a 400, a client error about
    # the request body, which is what this is.
    if requested is not None and requested != served:
        raise bad_request(f"The model `{requested}` does not exist; this server serves `{served}`.", "model")


def completion_inputs(body: CompletionRequest, engine: AsyncEngine) -> EngineInputs:
    check_model(body.model, engine.model_id)
    for name, unsupported in (
        ("echo", body.echo),
        ("logprobs", body.logprobs is not None),
        ("best_of", body.best_of not in (None, 1)),
        ("suffix", body.suffix is not None),
    ):
        if unsupported:
            raise bad_request(f"{name} is not supported by this server", name)
    inputs = _inputs(body, _completion_prompt(body, engine), body.max_tokens, engine)
    return _with_structured(inputs, response_format(body.response_format) or structured_outputs(body))


def chat_inputs(body: ChatCompletionRequest, engine: AsyncEngine) -> EngineInputs:
    check_model(body.model, engine.model_id)
    if body.logprobs or body.top_logprobs:
        raise bad_request("logprobs are not supported by this server", "logprobs")
    # Without a tool-call parser we could only return calls as plain text; vLLM refuses
    # the same way unless the client says it wants no calls.
    if body.tools and body.tool_choice != "none":
        raise bad_request('tools are only supported with tool_choice "none"', "tool_choice")
    messages = [{"role": m.role, "content": _message_text(m)} for m in body.messages]
    try:
        text = engine.apply_chat_template(messages, tools=body.tools)
    except jinja2.TemplateError as exc:
        raise bad_request(f"the chat template rejected these messages: {exc}", "messages") from exc
    max_tokens = body.max_completion_tokens or body.max_tokens
    inputs = _inputs(body, engine.encode(text), max_tokens, engine)
    return _with_structured(inputs, response_format(body.response_format) or structured_outputs(body))


def _with_structured(inputs: EngineInputs, structured: StructuredOutput | None) -> EngineInputs:
    return replace(inputs, params=replace(inputs.params, structured=structured)) if structured else inputs


def structured_outputs(body: SamplingFields) -> StructuredOutput | None:
    """vLLM's `structured_outputs`: one of json (a schema), json_object, or grammar (llguidance's Lark)."""
    spec = body.structured_outputs
    if not spec:
        return None
    given = [key for key in ("json", "json_object", "grammar") if spec.get(key) not in (None, False)]
    if len(given) != 1 or set(spec) - {"json", "json_object", "grammar"}:
        raise bad_request(
            "structured_outputs must hold exactly one of json, json_object or grammar", "structured_outputs"
        )
    kind = given[0]
    value = spec[kind]
    try:
        if kind == "json_object":
            structured = StructuredOutput("json_object")
        elif kind == "json":
            structured = StructuredOutput("json_schema", value if isinstance(value, str) else json.dumps(value))
        elif isinstance(value, str):
            structured = StructuredOutput("grammar", value)
        else:
            raise ValueError("structured_outputs.grammar must be a string")
        check_structured(structured)
    except (TypeError, ValueError, InvalidRequestError) as exc:
        raise bad_request(str(exc), "structured_outputs") from exc
    return structured


def response_format(value: dict[str, Any] | None) -> StructuredOutput | None:
    """OpenAI's response_format as vLLM takes it: text, json_object, or json_schema with its schema."""
    kind = (value or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    spec = (value or {}).get("json_schema")
    if kind != "json_schema" or not isinstance(spec, dict):
        raise bad_request(
            "response_format must be text, json_object, or json_schema with a json_schema", "response_format"
        )
    schema = spec.get("schema", spec.get("json_schema", {}))
    try:
        structured = StructuredOutput("json_schema", json.dumps(schema))
        check_structured(structured)
    except (TypeError, ValueError, InvalidRequestError) as exc:
        raise bad_request(str(exc), "response_format") from exc
    return structured


def _completion_prompt(body: CompletionRequest, engine: AsyncEngine) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise bad_request("a list of prompts is not supported; send one prompt per request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return list(engine.tokenizer.encode(prompt, add_special_tokens=body.add_special_tokens))
    return list(prompt)


def _message_text(message: ChatMessage) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    # vLLM joins text parts with newlines when the template wants a string.
    return "\n".join(part.text for part in message.content)


def _inputs(body: SamplingFields, prompt: list[int], max_tokens: int | None, engine: AsyncEngine) -> EngineInputs:
    if body.stream_options is not None and not body.stream:
        raise bad_request("stream_options can only be given when stream is true", "stream_options")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    params = SamplingParams(
        # No limit means the rest of the context; the engine clamps to what is left.
        max_tokens=max_tokens if max_tokens is not None else engine.max_model_len,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),  # vLLM spells "off" -1, the engine 0
        seed=body.seed,
        stop=stop,
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=bool(body.ignore_eos),
    )
    regions = None
    if body.cache_regions is not None:
        regions = tuple(CacheRegion(end=r.end, ttl_s=r.ttl_s) for r in body.cache_regions)
    return EngineInputs(
        prompt_token_ids=prompt,
        params=params,
        cache=CacheSpec(salt=body.cache_salt, regions=regions),
        share=FairShare(key=body.fair_share.key, weight=body.fair_share.weight) if body.fair_share else None,
        stream=bool(body.stream),
        include_usage=body.stream_options is not None and body.stream_options.include_usage,
        continuous_usage=body.stream_options is not None
        and body.stream_options.include_usage
        and body.stream_options.continuous_usage_stats,
    )
