"""Billing's domain errors become API errors here, once, for every billing route.

A `BillingDomainError` carries its status and error type; `BillingRoute` (the route class of
every billing router) turns one into the gateway's `GatewayError`, which the gateway's
exception handlers render like any other API error. A route class rather than an app-level
exception handler, so that the routers bring the mapping with them wherever they are mounted.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from billing.errors import BillingDomainError
from gateway.errors import GatewayError


def api_error(error: BillingDomainError) -> GatewayError:
    """The API error for a domain error: same message, its status and type."""
    api = GatewayError(str(error), param=getattr(error, "field", None))
    api.status = error.status
    api.anthropic_type = error.error_type
    api.openai_type = "invalid_request_error" if error.status < 500 else "server_error"
    return api


class BillingRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except BillingDomainError as error:
                raise api_error(error) from error

        return handle
