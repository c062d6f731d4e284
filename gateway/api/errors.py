"""Errors as each API spells them, and the exception handlers that produce them: the one place a
KvgateError (from any package) becomes an HTTP response."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from gateway.protocols.common import DISCRIMINATOR_TAGS
from gateway.refusals import attach_refusal
from kvgate.errors import InvalidRequestError, KvgateError, NotFoundError

Dialect = Literal["anthropic", "openai"]

# The usage API (/v1/organization/..., /v1/key) answers in OpenAI's shape, as OpenAI's and OpenRouter's do.
_OPENAI_PREFIXES = (
    *("/v1/chat/", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/organization/"),
    *("/v1/batches", "/v1/files"),  # OpenAI Batch and its files (gateway/batches)
)
_OPENAI_PATHS = ("/v1/key",)


def dialect_for(path: str, headers: Mapping[str, str]) -> Dialect:
    """Which API's error shape a request expects: by route, and for /v1/models by its headers."""
    if path.startswith(_OPENAI_PREFIXES) or path in _OPENAI_PATHS:
        return "openai"
    if path.startswith("/v1/models") and "anthropic-version" not in headers:
        return "openai"
    return "anthropic"


def anthropic_body(error: KvgateError, request_id: str | None) -> dict[str, object]:
    return {
        "type": "error",
        "error": {"type": error.anthropic_type, "message": error.message},
        "request_id": request_id,
    }


def openai_body(error: KvgateError) -> dict[str, object]:
    return {
        "error": {
            "message": error.message,
            "type": error.openai_type,
            "param": error.param,
            "code": error.openai_code,
        }
    }


def render_error(error: KvgateError, *, dialect: Dialect, request_id: str | None) -> Response:
    if dialect == "openai":
        status = error.openai_status or error.status
        return JSONResponse(openai_body(error), status_code=status, headers=error.headers)
    return JSONResponse(anthropic_body(error, request_id), status_code=error.status, headers=error.headers)


def _request_id(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


def _respond(request: Request, error: KvgateError) -> Response:
    log = request.scope.get("state", {}).get("log")
    if isinstance(log, dict):
        log["error_type"] = error.anthropic_type
    dialect = dialect_for(request.url.path, request.headers)
    response = render_error(error, dialect=dialect, request_id=_request_id(request))
    attach_refusal(request, error, response)  # a rate or budget refusal leaves a usage record
    return response


def _describe_loc(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    previous: Any = None
    for index, item in enumerate(loc):
        # Drop pydantic's union-member labels ("str", "list[...]", discriminator tags). A tag
        # follows a list index and has the member's fields after it ("content.0.text.cache_control"
        # is the text block's cache_control; "system.0.text" is a block's text field).
        is_tag = isinstance(previous, int) and item in DISCRIMINATOR_TAGS and index + 1 < len(loc)
        skip = isinstance(item, str) and ("[" in item or item in ("str", "int", "float", "bool", "none") or is_tag)
        if not skip:
            parts.append(str(item))
        previous = item
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts)


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One readable message for pydantic's errors: the most specific one first."""
    if not errors:
        return "invalid request", None
    for error in errors:
        if error.get("type") == "json_invalid":
            return f"the request body is not valid JSON: {error.get('ctx', {}).get('error', '')}".rstrip(": "), None
    best = max(errors, key=lambda e: len(e.get("loc", ())))
    if tuple(best.get("loc", ())) == ("body",):
        return "the request body must be a JSON object", None
    where = _describe_loc(tuple(best.get("loc", ())))
    message = f"{where}: {best.get('msg')}" if where else str(best.get("msg"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return message, where or None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(KvgateError)
    async def gateway_error(request: Request, exc: KvgateError) -> Response:
        return _respond(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        message, param = validation_message(list(exc.errors()))
        return _respond(request, InvalidRequestError(message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            error: KvgateError = NotFoundError(f"not found: {request.method} {request.url.path}")
        elif exc.status_code == 405:  # with `allow`; OpenAI's clients get a code, not null
            message = f"method not allowed: {request.method} {request.url.path}"
            error = InvalidRequestError(message, headers=dict(exc.headers or {}))
            error.status, error.openai_code = 405, "method_not_allowed"
        else:
            error = InvalidRequestError(str(exc.detail), headers=dict(exc.headers or {}))
            error.status = exc.status_code
        return _respond(request, error)
