"""Billing's domain errors: kvgate errors (kvgate.errors), so each carries its HTTP status and its
type per API, and the gateway's one mapping (gateway.api.errors) renders them.

Domain code raises them without knowing about HTTP; the CLI prints the message with exit status 1.
"""

from __future__ import annotations

from kvgate.errors import InvalidRequestError, UnavailableError

__all__ = ["BillingDomainError", "NotConfiguredError", "UnavailableError"]


class BillingDomainError(InvalidRequestError):
    """Bad input or a state that forbids the operation (a 400 unless a subclass says otherwise).

    `field` names the input at fault, as the admin API or the CLI names it; the API reports it as `param`.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, param=field)
        self.field = field


class NotConfiguredError(BillingDomainError):
    """A feature this server is not configured for (billing itself, Stripe).

    A 400, not a 503: the request cannot succeed until an operator changes the settings,
    so a client must not retry it as if the server were briefly unavailable.
    """
