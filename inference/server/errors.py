"""OpenAI-shaped errors, as vLLM sends them: {"error": {"message", "type", "param", "code"}}.

Every failure leaves the server as one of these, so the openai SDK raises its usual
exception classes (BadRequestError for 400, NotFoundError for 404...). Bad input is
always a 4xx; only a bug in the server or the engine is a 500.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inference.server.protocol import ErrorInfo, ErrorResponse
from inference.types import EngineOverloadedError, EngineUnavailableError, InvalidRequestError

log = structlog.get_logger(__name__)

# vLLM names the type after the status, like the SDK's exception classes.
_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list"}
# A dead engine does not come back by itself (a supervisor restarts the process).
UNAVAILABLE_RETRY_S = 10


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(HTTPStatus.BAD_REQUEST, message, param)


def error_body(status: int, message: str, param: str | None = None) -> ErrorResponse:
    kind = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=status))


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param).model_dump(), status_code=status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first problem, phrased for a person, and the field it concerns."""
    # A union (prompt: str | list[int]...) reports one error per member; the deepest one
    # says most (for an image part: "content.0.type: Input should be 'text'").
    first: dict[str, Any] = max(exc.errors(), key=lambda e: len(e.get("loc", ())))
    # Union members appear in the path by type name ("str", "list[int]"): noise to a client.
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and p not in _TYPE_NAMES and "[" not in str(p)]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    if first.get("type") == "value_error" and "error" in first.get("ctx", {}):
        message = str(first["ctx"]["error"])
    else:
        message = str(first.get("msg", "invalid request"))
    return (f"{param}: {message}" if param else message), param


async def _on_api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc.status, exc.message, exc.param)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = _validation_message(exc)
    return error_response(HTTPStatus.BAD_REQUEST, message, param)


async def _on_invalid_request(_: Request, exc: Exception) -> JSONResponse:
    return error_response(HTTPStatus.BAD_REQUEST, str(exc))


async def _on_overloaded(_: Request, exc: Exception) -> JSONResponse:
    response = error_response(HTTPStatus.SERVICE_UNAVAILABLE, f"the engine is overloaded: {exc}")
    response.headers["retry-after"] = "1"
    return response


async def _on_unavailable(_: Request, exc: Exception) -> JSONResponse:
    response = error_response(HTTPStatus.SERVICE_UNAVAILABLE, str(exc))
    response.headers["retry-after"] = str(UNAVAILABLE_RETRY_S)
    return response


async def _on_http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(exc.status_code, str(exc.detail))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("request_failed", path=request.url.path, error=str(exc))
    return error_response(HTTPStatus.INTERNAL_SERVER_ERROR, "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(InvalidRequestError, _on_invalid_request)
    app.add_exception_handler(EngineOverloadedError, _on_overloaded)
    app.add_exception_handler(EngineUnavailableError, _on_unavailable)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
