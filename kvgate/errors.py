"""Errors a client sees, each with its HTTP status and its type in each API (Anthropic, OpenAI).

Every package raises KvgateError subclasses (billing's domain errors among them);
gateway.api.errors maps them to HTTP once, in the shape of the API the request was
made to. Nothing else turns an error into a status.
"""

from __future__ import annotations

import math


class KvgateError(Exception):
    status: int = 500
    openai_status: int | None = None  # where OpenAI's clients expect another status than `status`
    anthropic_type: str = "api_error"
    openai_type: str = "server_error"
    openai_code: str | None = None
    # A refusal for a limit, recorded as a usage record with status "refused" (gateway/refusals.py): the
    # limit's name, and the reserve that did not fit it in pico-dollars (None where no money was at stake).
    refusal: str | None = None
    refusal_reserve_pico: int | None = None

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


def _restore(cls: type[KvgateError], state: dict[str, object]) -> KvgateError:
    error = cls.__new__(cls)
    Exception.__init__(error, state.get("message"))
    error.__dict__.update(state)
    return error


class InvalidRequestError(KvgateError):
    status = 400
    anthropic_type = "invalid_request_error"
    openai_type = "invalid_request_error"


class PromptTooLongError(InvalidRequestError):
    """The prompt cannot fit the model's context (OpenAI names the case with its own code)."""

    openai_code = "context_length_exceeded"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="messages")


class AuthenticationError(KvgateError):
    status = 401
    anthropic_type = "authentication_error"
    openai_type = "invalid_request_error"
    openai_code = "invalid_api_key"


class BillingError(KvgateError):
    """A budget or payment problem; billing's admission hook raises it."""

    status = 402
    anthropic_type = "billing_error"
    openai_type = "insufficient_quota"
    openai_code = "insufficient_quota"

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        # Retrying cannot help until someone raises the limit or adds credit: both SDKs honour
        # x-should-retry, so a refused request is sent once (OpenAI's would retry its 429 twice).
        super().__init__(message, param=param, headers={"x-should-retry": "false", **(headers or {})})


class PermissionDeniedError(KvgateError):
    status = 403
    anthropic_type = "permission_error"
    openai_type = "permission_error"
    openai_code = "permission_denied"


class NotFoundError(KvgateError):
    status = 404
    anthropic_type = "not_found_error"
    openai_type = "invalid_request_error"
    openai_code = "not_found"


class ModelNotFoundError(NotFoundError):
    openai_code = "model_not_found"


class RequestTooLargeError(KvgateError):
    status = 413
    anthropic_type = "request_too_large"
    openai_type = "invalid_request_error"
    openai_code = "request_too_large"


class RequestTimeoutError(KvgateError):
    """The client did not send the request body in time."""

    status = 408
    anthropic_type = "invalid_request_error"
    openai_type = "invalid_request_error"
    openai_code = "request_timeout"


class _RetryableError(KvgateError):
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
    refusal = "rate_limit"


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
    openai_status = None


class ConflictError(KvgateError):
    """The request conflicts with the state of what it names (finalizing a running month)."""

    status = 409
    anthropic_type = "conflict_error"
    openai_type = "invalid_request_error"


class UnavailableError(KvgateError):
    """A part the request needs is not configured or not reachable now."""

    status = 503
    anthropic_type = "api_error"


# How long clients are told to wait while the database is away.
DATABASE_RETRY_AFTER_S = 2.0


def database_unavailable_error(path: str) -> DatabaseUnavailableError:
    """The retryable error for a request that needs the database while it is away: 529/503 on the
    model APIs (the key may well be valid), 503 on the admin API and elsewhere."""
    message = "the database is unavailable; retry after the time in the retry-after header"
    if path.startswith("/v1/"):
        return DatabaseUnavailableError(message, retry_after_s=DATABASE_RETRY_AFTER_S)
    return AdminDatabaseUnavailableError(message, retry_after_s=DATABASE_RETRY_AFTER_S)


class EngineUnavailableError(OverloadedError):
    """The engine is not serving (its thread died, or the server is stopping): 529 / OpenAI 503, with retry-after."""


class ApiError(KvgateError):
    status = 500
    anthropic_type = "api_error"
    openai_type = "server_error"
