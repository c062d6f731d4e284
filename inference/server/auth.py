"""Who may use an engine server: the gateways that hold its bearer token (KVGATE_ENGINE_TOKEN).

An engine trusts its caller with everything: the cache salt (whose tenant's blocks a
request reads), 30-day cache regions (blocks pinned against every other tenant), free
generation, and the KV snapshot. So with a token set, every route but /health needs
`Authorization: Bearer <token>`; without one, `kvgate engine serve` binds loopback only
(inference/preflight.py), where only this machine's processes reach it.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from inference.server.errors import error_response

# Load balancers and supervisors probe /health without credentials; it says only up or down
# (its ?detail=true view, the kernel plan, needs the token like everything else).
OPEN_PATHS = frozenset({"/health"})
# /drain has its own check (KVGATE_DRAIN_TOKEN, or loopback): an operator's drain token opens it.
OWN_CHECK_PATHS = frozenset({"/drain"})


def presented_token(authorization: str | None) -> str:
    scheme, _, value = (authorization or "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def token_matches(authorization: str | None, token: str) -> bool:
    return hmac.compare_digest(presented_token(authorization).encode(), token.encode())


def require_engine_token(
    token: str,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """Middleware: 401 in vLLM's error shape unless the request carries the token (or is an open probe)."""

    async def check(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        open_probe = path in OPEN_PATHS and request.query_params.get("detail", "false") == "false"
        if open_probe or path in OWN_CHECK_PATHS or token_matches(request.headers.get("authorization"), token):
            return await call_next(request)
        response = error_response(401, "this engine needs a valid bearer token (KVGATE_ENGINE_TOKEN)")
        response.headers["www-authenticate"] = "Bearer"
        return response

    return check
