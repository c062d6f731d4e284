"""Request bodies the completion routes read themselves: bounded, and parsed off the event loop when large.

FastAPI would parse and validate a body on the event loop before the handler runs
(and before authentication). The completion routes instead authenticate, take
their rate-limit unit, read the body against the model's byte bound, and only then
parse it: inline when it is small, on the gateway's CPU pool when it is not. The
errors are FastAPI's, to the letter (same JSON decoding, same validation, locations
under "body"), so validation_message words them exactly as before.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from gateway.generation import RequestContext
from gateway.state import Gateway
from gateway.unicode_text import lone_surrogate, lone_surrogate_message, may_hold_surrogate
from kvgate.errors import InvalidRequestError, RequestTooLargeError

# Bodies up to this size are parsed, rendered and tokenized on the event loop: a few
# milliseconds at most, less than the hand-off to a thread would cost in latency.
INLINE_BODY_BYTES = 8 * 1024

M = TypeVar("M", bound=BaseModel)
P = TypeVar("P")


async def read_body(request: Request, *, limit: int | None) -> bytes:
    """The raw body; 413 as soon as it is known to exceed `limit` (from Content-Length, before reading)."""
    declared = request.headers.get("content-length", "")
    if limit is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if limit is not None and size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"request body exceeds {limit} bytes, more than any prompt that fits this model's context can need"
    )


def decode_body(raw: bytes, *, content_type: str | None, model: type[M]) -> M:
    """Parse and validate a JSON body as FastAPI does (strict content type), refusing lone surrogates."""
    value: Any = raw
    if not raw:
        _fail([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    if _is_json(content_type):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            _fail([{"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {},
                    "ctx": {"error": exc.msg}}])  # fmt: skip
        except UnicodeDecodeError as exc:  # FastAPI's words for a body that is not UTF-8
            raise InvalidRequestError("There was an error parsing the body") from exc
        if may_hold_surrogate(raw):
            found = lone_surrogate(value)
            if found is not None:
                where, code_point = found
                raise InvalidRequestError(lone_surrogate_message(where, code_point), param=where or None)
    try:
        return model.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        _fail(errors)
        raise  # unreachable: _fail raises


def _fail(errors: list[dict[str, Any]]) -> None:
    raise RequestValidationError(errors)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False  # FastAPI's strict content type: no header, no JSON
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


async def parse_and_prepare(
    gw: Gateway,
    *,
    ctx: RequestContext,
    request: Request,
    model: type[M],
    prepare: Callable[[M], P],
) -> tuple[M, P]:
    """Read, parse and validate the body, then prepare it (render, tokenize): off the loop when large.

    The model's byte bound (gateway.prompt_bounds) refuses a hopeless body before a byte
    of it is parsed; a large one is parsed and prepared on the CPU pool, one job per
    tenant at a time.
    """
    raw = await read_body(request, limit=gw.renderer.bounds.max_body_bytes)
    content_type = request.headers.get("content-type")

    def work() -> tuple[M, P]:
        body = decode_body(raw, content_type=content_type, model=model)
        return body, prepare(body)

    if len(raw) <= INLINE_BODY_BYTES:
        return work()
    return await gw.cpu.run(ctx.principal.tenant_id, work)
