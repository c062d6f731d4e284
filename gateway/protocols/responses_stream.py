"""Responses API objects from a Generation: the response body, and its server-sent event stream.

The stream is OpenAI's event sequence, each event named and numbered by sequence_number:
response.created, response.in_progress, then each output item's events (a message's
response.output_text.delta, one per engine delta, or a function call's
response.function_call_arguments.*; see gateway.protocols.responses_output), then
response.completed, or response.incomplete when max_output_tokens cut the output. A
failure is an `error` event followed by response.failed. With tools the output is read
by gateway.tools.parse as it streams, so no piece of a `<tool_call>` tag goes out as text.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from decimal import Decimal
from typing import Any, Literal

import structlog
from pydantic import BaseModel, Field

from gateway.generation import Finished, Generation, output_error
from gateway.logs import log_failure
from gateway.protocols.common import cost_number
from gateway.protocols.responses import ResponseSettings
from gateway.protocols.responses_output import OutputBuilder, OutputItem
from gateway.sse import event
from gateway.tools.parse import ToolCallParser, ToolParsing, new_call_id, parse_output
from kvgate.errors import KvgateError

# --- the response object -----------------------------------------------------------------------


class InputTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int
    cost_usd: Decimal | None = Field(None, exclude_if=lambda v: v is None)
    cost: float | None = Field(None, exclude_if=lambda v: v is None)  # cost_usd as a number (OpenRouter's)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


ResponseStatus = Literal["completed", "failed", "in_progress", "incomplete"]


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    completed_at: int | None = None
    background: bool = False
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt_cache_diagnostics: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    safety_identifier: str | None = None
    service_tier: str = "default"
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: Any = "auto"
    tools: list[Any] = Field(default_factory=list)
    top_logprobs: int = 0
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class InputTokenCount(BaseModel):
    """What POST /v1/responses/input_tokens answers (the openai SDK's InputTokenCountResponse)."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


def response_id(request_id: str) -> str:
    return "resp_" + request_id.removeprefix("req_")


log = structlog.get_logger("kvgate.gateway")
CALL_ID_PREFIX = "call_"

# Called with the finished response before the client hears of it (to store it first).
Persist = Callable[[ResponseObject], Awaitable[None]]


def usage_of(finished: Finished) -> ResponseUsage:
    counts = finished.counts
    return ResponseUsage(
        input_tokens=counts.prompt_tokens,
        input_tokens_details=InputTokensDetails(
            cached_tokens=counts.cache_read, cache_write_tokens=counts.cache_writes
        ),
        output_tokens=counts.output,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=counts.prompt_tokens + counts.output,
        cost_usd=finished.cost_usd,
        cost=cost_number(finished.cost_usd),
    )


def _shell(settings: ResponseSettings, *, request_id: str, created_at: int, status: ResponseStatus) -> ResponseObject:
    return ResponseObject(
        id=response_id(request_id),
        created_at=created_at,
        status=status,
        instructions=settings.instructions,
        max_output_tokens=settings.max_output_tokens,
        model=settings.model,
        output=[],
        previous_response_id=settings.previous_response_id,
        prompt_cache_diagnostics=settings.prompt_cache_diagnostics,
        prompt_cache_key=settings.prompt_cache_key,
        prompt_cache_options=settings.prompt_cache_options,
        prompt_cache_retention=settings.prompt_cache_retention,
        safety_identifier=settings.safety_identifier,
        store=settings.store,
        temperature=settings.temperature,
        text=settings.text,
        top_p=settings.top_p,
        user=settings.user,
        metadata=settings.metadata,
        tools=settings.tools,
        tool_choice=settings.tool_choice,
        parallel_tool_calls=settings.parallel_tool_calls,
        max_tool_calls=settings.max_tool_calls,
    )


def _status(finished: Finished) -> ResponseStatus:
    return "incomplete" if finished.output.finish_reason == "length" else "completed"


def _finished_response(
    finished: Finished, output: OutputBuilder, *, settings: ResponseSettings, request_id: str, created_at: int
) -> ResponseObject:
    """The finished response: completed, or incomplete when the output was cut at max_output_tokens."""
    status = _status(finished)
    response = _shell(settings, request_id=request_id, created_at=created_at, status=status)
    response.output = output.items
    response.usage = usage_of(finished)
    if status == "incomplete":
        response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
    else:
        response.completed_at = int(time.time())
    return response


def response_of(
    finished: Finished,
    *,
    settings: ResponseSettings,
    request_id: str,
    created_at: int,
    tools: ToolParsing | None = None,
) -> ResponseObject:
    """The whole response; with tools, the calls in the output are function_call items."""
    output = OutputBuilder(request_id)
    text = finished.output.text
    if tools is None:
        output.text(text)
    else:
        output.feed(parse_output(text, tools, id_prefix=CALL_ID_PREFIX))
    output.finish(_status(finished))
    return _finished_response(finished, output, settings=settings, request_id=request_id, created_at=created_at)


def _error_code(error: KvgateError) -> str:
    return "invalid_prompt" if error.status == 400 else "server_error"


async def response_events(
    gen: Generation,
    *,
    settings: ResponseSettings,
    request_id: str,
    created_at: int,
    persist: Persist,
    tools: ToolParsing | None = None,
) -> AsyncGenerator[bytes, None]:
    sequence = 0

    def emit(kind: str, body: dict[str, Any]) -> bytes:
        nonlocal sequence
        data = {"type": kind, "sequence_number": sequence, **body}
        sequence += 1
        return event(kind, data)

    def snapshot(status: ResponseStatus) -> dict[str, Any]:
        shell = _shell(settings, request_id=request_id, created_at=created_at, status=status)
        return {"response": shell.model_dump(mode="json")}

    output = OutputBuilder(request_id)
    parser = ToolCallParser(tools, new_id=lambda: new_call_id(CALL_ID_PREFIX)) if tools else None
    done = False
    try:
        yield emit("response.created", snapshot("in_progress"))
        yield emit("response.in_progress", snapshot("in_progress"))
        for kind, body in output.open_message() if parser is None else []:
            yield emit(kind, body)
        async for delta in gen.handle:
            for kind, body in output.feed(parser.feed(delta.text)) if parser else output.text(delta.text):
                yield emit(kind, body)
        finished = await gen.finish(await gen.handle.result())
        done = True
        if finished.status == "error":
            for chunk in _failure(emit, snapshot, output_error(finished.output)):
                yield chunk
            return
        closing = output.feed(parser.close()) if parser else []
        for kind, body in closing + output.finish(_status(finished)):
            yield emit(kind, body)
        response = _finished_response(finished, output, settings=settings, request_id=request_id, created_at=created_at)
        await persist(response)
        final = "response.incomplete" if response.status == "incomplete" else "response.completed"
        yield emit(final, {"response": response.model_dump(mode="json")})
    except Exception:
        log_failure(log, "stream_failed", request_id=request_id)
        for chunk in _failure(emit, snapshot, KvgateError("Internal server error")):
            yield chunk
    finally:
        if not done:
            gen.abandon()


def _failure(
    emit: Callable[[str, dict[str, Any]], bytes],
    snapshot: Callable[[ResponseStatus], dict[str, Any]],
    error: KvgateError,
) -> list[bytes]:
    """An `error` event (its nested `error` makes the SDK raise, as for Chat Completions), then response.failed."""
    code = _error_code(error)
    body = {"type": error.openai_type, "code": code, "message": error.message, "param": error.param}
    failed = snapshot("failed")
    failed["response"]["error"] = ResponseError(code=code, message=error.message).model_dump(mode="json")
    return [
        emit("error", {"code": code, "message": error.message, "param": error.param, "error": body}),
        emit("response.failed", failed),
    ]
