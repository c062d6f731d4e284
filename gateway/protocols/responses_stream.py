"""Responses API objects from a Generation: the response body, and its server-sent event stream.

The stream is OpenAI's event sequence, each event named and numbered by sequence_number:
response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta (one per engine delta),
response.output_text.done, response.content_part.done, response.output_item.done, then
response.completed, or response.incomplete when max_output_tokens cut the output. A
failure is an `error` event followed by response.failed.
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
from gateway.protocols.responses import ResponseSettings
from gateway.sse import event
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


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


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
    output: list[OutputMessage]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
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


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


def response_id(request_id: str) -> str:
    return "resp_" + request_id.removeprefix("req_")


def message_id(request_id: str) -> str:
    return "msg_" + request_id.removeprefix("req_")


log = structlog.get_logger("kvgate.gateway")

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
        prompt_cache_key=settings.prompt_cache_key,
        prompt_cache_retention=settings.prompt_cache_retention,
        safety_identifier=settings.safety_identifier,
        store=settings.store,
        temperature=settings.temperature,
        text=settings.text,
        top_p=settings.top_p,
        user=settings.user,
        metadata=settings.metadata,
    )


def _message(request_id: str, text: str, status: Any) -> OutputMessage:
    return OutputMessage(id=message_id(request_id), status=status, content=[OutputText(text=text)])


def response_of(finished: Finished, *, settings: ResponseSettings, request_id: str, created_at: int) -> ResponseObject:
    """The finished response: completed, or incomplete when the output was cut at max_output_tokens."""
    cut = finished.output.finish_reason == "length"
    status: ResponseStatus = "incomplete" if cut else "completed"
    response = _shell(settings, request_id=request_id, created_at=created_at, status=status)
    response.output = [_message(request_id, finished.output.text, status)]
    response.usage = usage_of(finished)
    if cut:
        response.incomplete_details = IncompleteDetails(reason="max_output_tokens")
    else:
        response.completed_at = int(time.time())
    return response


def _error_code(error: KvgateError) -> str:
    return "invalid_prompt" if error.status == 400 else "server_error"


async def response_events(
    gen: Generation, *, settings: ResponseSettings, request_id: str, created_at: int, persist: Persist
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

    item_id = message_id(request_id)
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    done = False
    try:
        yield emit("response.created", snapshot("in_progress"))
        yield emit("response.in_progress", snapshot("in_progress"))
        item = _message(request_id, "", "in_progress").model_dump(mode="json")
        item["content"] = []
        yield emit("response.output_item.added", {"output_index": 0, "item": item})
        yield emit("response.content_part.added", {**where, "part": OutputText(text="").model_dump(mode="json")})
        async for delta in gen.handle:
            if delta.text:
                yield emit("response.output_text.delta", {**where, "delta": delta.text, "logprobs": []})
        finished = await gen.finish(await gen.handle.result())
        done = True
        if finished.status == "error":
            for chunk in _failure(emit, snapshot, output_error(finished.output)):
                yield chunk
            return
        response = response_of(finished, settings=settings, request_id=request_id, created_at=created_at)
        text = finished.output.text
        yield emit("response.output_text.done", {**where, "text": text, "logprobs": []})
        yield emit("response.content_part.done", {**where, "part": OutputText(text=text).model_dump(mode="json")})
        yield emit("response.output_item.done", {"output_index": 0, "item": response.output[0].model_dump(mode="json")})
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
