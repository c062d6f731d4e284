"""Errors the gateway returns, and how each API (Anthropic, OpenAI) spells them.

Handlers and services raise GatewayError subclasses; the exception handlers in
gateway.api.errors render them in the shape of the API the request was made to.
"""

from __future__ import annotations

import math


class GatewayError(Exception):
    status: int = 500
    anthropic_type: str = "api_error"
    openai_type: str = "server_error"
    openai_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = dict(headers or {})

    def __reduce__(self) -> tuple[object, ...]:
        # Raised in worker processes too (gateway.request_workers): rebuilt with every attribute.
        return (_restore, (type(self), self.__dict__.copy()))


def _restore(cls: type[GatewayError], state: dict[str, object]) -> GatewayError:
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("message"))
    error.__dict__.update(state)
    return error


class InvalidRequestError(GatewayError):
    status = 400
    anthropic_type = "invalid_request_error"
    openai_type = "invalid_request_error"


class PromptTooLongError(InvalidRequestError):
    """The prompt cannot fit the model's context (OpenAI names the case with its own code)."""

    openai_code = "context_length_exceeded"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="messages")


class AuthenticationError(GatewayError):
    status = 401
    anthropic_type = "authentication_error"
    openai_type = "invalid_request_error"
    openai_code = "invalid_api_key"


class BillingError(GatewayError):
    """A budget or payment problem; billing's admission hook raises it."""

    status = 402
    anthropic_type = "billing_error"
    openai_type = "insufficient_quota"
    openai_code = "insufficient_quota"


class PermissionDeniedError(GatewayError):
    status = 403
    anthropic_type = "permission_error"
    openai_type = "permission_error"
    openai_code = "permission_denied"


class NotFoundError(GatewayError):
    status = 404
    anthropic_type = "not_found_error"
    openai_type = "invalid_request_error"
    openai_code = "not_found"


class ModelNotFoundError(NotFoundError):
    openai_code = "model_not_found"


class RequestTooLargeError(GatewayError):
    status = 413
    anthropic_type = "request_too_large"
    openai_type = "invalid_request_error"
    openai_code = "request_too_large"


class RequestTimeoutError(GatewayError):
    """The client did not send the request body in time."""

    status = 408
    anthropic_type = "invalid_request_error"
    openai_type = "invalid_request_error"
    openai_code = "request_timeout"


class _RetryableError(GatewayError):
    def __init__(self, message: str, *, retry_after_s: float, headers: dict[str, str] | None = None) -> None:
        merged = {"retry-after": str(max(1, math.ceil(retry_after_s)))}
        merged.update(headers or {})
        super().__init__(message, headers=merged)
        self.retry_after_s = retry_after_s


class RateLimitError(_RetryableError):
    status = 429
    anthropic_type = "rate_limit_error"
    openai_type = "requests"
    openai_code = "rate_limit_exceeded"


class OverloadedError(_RetryableError):
    """The engine's queue is full. Anthropic says 529; OpenAI clients know 503."""

    status = 529
    anthropic_type = "overloaded_error"
    openai_type = "server_error"
    openai_code = "overloaded"
    openai_status = 503


class DatabaseUnavailableError(_RetryableError):
    """The database cannot be reached and the answer depends on it (an unknown key, a budget we
    cannot check): retry shortly. On the model APIs Anthropic says 529 overloaded_error, OpenAI 503."""

    status = 529
    anthropic_type = "overloaded_error"
    openai_type = "server_error"
    openai_code = "service_unavailable"
    openai_status = 503


class AdminDatabaseUnavailableError(DatabaseUnavailableError):
    """The same on the admin API and other non-model routes: a plain 503."""

    status = 503
    anthropic_type = "api_error"


# How long clients are told to wait while the database is away.
DATABASE_RETRY_AFTER_S = 2.0


class EngineUnavailableError(OverloadedError):
    """The engine is not serving (its thread died, or the server is stopping): 529 / OpenAI 503, with retry-after."""


class ApiError(GatewayError):
    status = 500
    anthropic_type = "api_error"
    openai_type = "server_error"


def openai_status(error: GatewayError) -> int:
    return getattr(error, "openai_status", error.status)


def anthropic_body(error: GatewayError, request_id: str | None) -> dict[str, object]:
    return {
        "type": "error",
        "error": {"type": error.anthropic_type, "message": error.message},
        "request_id": request_id,
    }


def openai_body(error: GatewayError) -> dict[str, object]:
    return {
        "error": {
            "message": error.message,
            "type": error.openai_type,
            "param": error.param,
            "code": error.openai_code,
        }
    }
