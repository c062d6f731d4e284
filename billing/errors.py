"""The base of billing's domain errors: each class carries the HTTP status and error type it is shown with.

Domain code raises them without knowing about HTTP; the API maps every one in a single place
(`billing.api.errors`), and the CLI prints its message with exit status 1. A subclass overrides
`status` and `error_type` (the Anthropic-style `error.type`, which the admin API speaks).
"""

from __future__ import annotations

from typing import ClassVar


class BillingDomainError(Exception):
    """Bad input or a state that forbids the operation; never a server fault."""

    status: ClassVar[int] = 400
    error_type: ClassVar[str] = "invalid_request_error"


class UnavailableError(BillingDomainError):
    """The database is away right now: retry shortly."""

    status = 503
    error_type = "api_error"


class NotConfiguredError(BillingDomainError):
    """A feature this server is not configured for (billing itself, Stripe).

    A 400, not a 503: the request cannot succeed until an operator changes the settings,
    so a client must not retry it as if the server were briefly unavailable.
    """

    status = 400
    error_type = "invalid_request_error"
